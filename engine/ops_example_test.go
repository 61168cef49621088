package engine_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/sys/mem"
)

// WriteMetrics gives the engine's counters in Prometheus's text format, to
// serve from the application's own /metrics (or set Config.MetricsAddr).
func ExampleEngine_WriteMetrics() {
	e, _ := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Transports: []string{"local"}})
	defer e.Close()
	buf := mem.MustAlloc(8192)
	defer mem.Free(buf)
	e.RegisterMemory(mem.Addr(buf), 8192, "cpu", true)
	seg, _ := e.OpenSegment(e.Name())
	defer e.CloseSegment(seg)
	b, _ := e.AllocateBatch(1)
	defer b.Free()
	b.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(buf), Segment: seg, Remote: mem.Addr(buf) + 4096, Length: 4096})
	b.Wait(5 * time.Second)

	var m bytes.Buffer
	e.WriteMetrics(&m)
	sc := bufio.NewScanner(&m)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# TYPE te_tasks_total") || strings.HasPrefix(line, `te_tasks_total{state="completed"}`) ||
			strings.HasPrefix(line, "te_transferred_bytes_total") ||
			strings.HasPrefix(line, `te_task_duration_seconds_count{transport="local"`) {
			fmt.Println(line)
		}
	}
	// Output:
	// # TYPE te_tasks_total counter
	// te_tasks_total{state="completed"} 1
	// te_transferred_bytes_total 4096
	// te_task_duration_seconds_count{transport="local",peer="same_process"} 1
	// te_task_duration_seconds_count{transport="local",peer="same_host"} 0
	// te_task_duration_seconds_count{transport="local",peer="other_host"} 0
}

// A field left unset comes from the environment; a value that does not
// parse is refused, naming the variable.
func ExampleConfig_environment() {
	os.Setenv("TE_MAX_CONNS", "lots")
	defer os.Unsetenv("TE_MAX_CONNS")
	_, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0"})
	fmt.Println(err)
	// Output: new: invalid argument: TE_MAX_CONNS="lots": want an integer from 1 to 1048576
}
