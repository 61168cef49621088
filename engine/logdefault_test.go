package engine_test

import (
	"bufio"
	"os"
	"regexp"
	"testing"

	"github.com/tecache/te/engine"
)

// TestDefaultLoggerIsTeStyle: an engine without Config.Logger logs on
// stderr in te's style (README.md, "Logs"), as libte, te-bench and
// te-sidecar do, not in log's default "2006/01/02 15:04:05 INFO" format;
// TE_LOG_FORMAT=json makes it JSON lines.
func TestDefaultLoggerIsTeStyle(t *testing.T) {
	for format, want := range map[string]*regexp.Regexp{
		"":     regexp.MustCompile(`^time=\S+ level=[A-Z]+ msg="te: `),
		"json": regexp.MustCompile(`^\{"time":"[^"]+","level":"[A-Z]+","msg":"te: `),
	} {
		t.Run("format="+format, func(t *testing.T) {
			t.Setenv("TE_LOG_FORMAT", format)
			t.Setenv("TE_LOG_LEVEL", "") // the default level: info
			t.Setenv("TE_AUTH_SECRET", "")
			t.Setenv("TE_AUTH_SECRET_FILE", "")
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			saved := os.Stderr
			os.Stderr = w // the default logger writes to the stderr New finds
			e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", ForceTransport: "tcp"})
			os.Stderr = saved
			if err != nil {
				w.Close()
				t.Fatal(err)
			}
			e.Close()
			w.Close()
			sc := bufio.NewScanner(r)
			if !sc.Scan() {
				t.Fatal("the engine logged nothing (it warns that it has no cluster secret)")
			}
			if !want.MatchString(sc.Text()) {
				t.Fatalf("first log line %q: want te's style %v", sc.Text(), want)
			}
		})
	}
}
