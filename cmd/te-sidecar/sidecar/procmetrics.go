package sidecar

import (
	"bufio"
	"bytes"
	"io"
	"strings"

	vm "github.com/VictoriaMetrics/metrics"
)

// procFamilies are the Go runtime and process families /metrics exports,
// from github.com/VictoriaMetrics/metrics's WriteProcessMetrics and
// WriteFDMetrics, with the type and help those write without (they write
// no HELP, and call the cumulative process_io_* figures gauges). Families
// they write that are not listed are left out: the runtime histograms
// (written without _sum and _count), counters without the _total suffix
// (go_cgo_calls_count, go_gc_forced_count), go_cpu_count (a _count that is
// not a histogram's) and go_info_ext.
var procFamilies = map[string][2]string{
	"go_gc_cpu_seconds_total":             {"counter", "CPU time spent on garbage collection, in seconds."},
	"go_gc_duration_seconds":              {"summary", "Pause durations of recent garbage collections, in seconds."},
	"go_gc_mark_assist_cpu_seconds_total": {"counter", "CPU time goroutines spent assisting the garbage collector, in seconds."},
	"go_gomaxprocs":                       {"gauge", "GOMAXPROCS (set from the cgroup CPU quota)."},
	"go_goroutines":                       {"gauge", "Goroutines that exist now."},
	"go_info":                             {"gauge", "The Go version the sidecar was built with (always 1)."},
	"go_memlimit_bytes":                   {"gauge", "The Go runtime's soft memory limit (GOMEMLIMIT), in bytes."},
	"go_memstats_alloc_bytes":             {"gauge", "Bytes of allocated heap objects."},
	"go_memstats_alloc_bytes_total":       {"counter", "Bytes allocated for heap objects since start."},
	"go_memstats_buck_hash_sys_bytes":     {"gauge", "Bytes of memory in profiling bucket hash tables."},
	"go_memstats_frees_total":             {"counter", "Heap objects freed since start."},
	"go_memstats_gc_cpu_fraction":         {"gauge", "Fraction of the available CPU time used by the garbage collector since start."},
	"go_memstats_gc_sys_bytes":            {"gauge", "Bytes of memory in garbage collection metadata."},
	"go_memstats_heap_alloc_bytes":        {"gauge", "Bytes of allocated heap objects."},
	"go_memstats_heap_idle_bytes":         {"gauge", "Bytes in idle heap spans."},
	"go_memstats_heap_inuse_bytes":        {"gauge", "Bytes in in-use heap spans."},
	"go_memstats_heap_objects":            {"gauge", "Allocated heap objects."},
	"go_memstats_heap_released_bytes":     {"gauge", "Bytes of heap memory returned to the OS."},
	"go_memstats_heap_sys_bytes":          {"gauge", "Bytes of heap memory obtained from the OS."},
	"go_memstats_last_gc_time_seconds":    {"gauge", "Unix time the last garbage collection finished."},
	"go_memstats_lookups_total":           {"counter", "Pointer lookups performed by the runtime since start."},
	"go_memstats_mallocs_total":           {"counter", "Heap objects allocated since start."},
	"go_memstats_mcache_inuse_bytes":      {"gauge", "Bytes of allocated mcache structures."},
	"go_memstats_mcache_sys_bytes":        {"gauge", "Bytes of memory obtained from the OS for mcache structures."},
	"go_memstats_mspan_inuse_bytes":       {"gauge", "Bytes of allocated mspan structures."},
	"go_memstats_mspan_sys_bytes":         {"gauge", "Bytes of memory obtained from the OS for mspan structures."},
	"go_memstats_next_gc_bytes":           {"gauge", "Heap size the next garbage collection aims at, in bytes."},
	"go_memstats_other_sys_bytes":         {"gauge", "Bytes of memory in other off-heap runtime allocations."},
	"go_memstats_stack_inuse_bytes":       {"gauge", "Bytes in stack spans."},
	"go_memstats_stack_sys_bytes":         {"gauge", "Bytes of stack memory obtained from the OS."},
	"go_memstats_sys_bytes":               {"gauge", "Bytes of memory obtained from the OS."},
	"go_mutex_wait_seconds_total":         {"counter", "Time goroutines spent blocked on a sync.Mutex or sync.RWMutex, in seconds."},
	"go_scavenge_cpu_seconds_total":       {"counter", "CPU time spent returning memory to the OS, in seconds."},
	"go_threads":                          {"gauge", "OS threads created by the runtime."},

	"process_cgroup_cpu_throttled_seconds_total":    {"counter", "Time the cgroup's CPU quota throttled the process, in seconds."},
	"process_cpu_seconds_system_total":              {"counter", "CPU time in the kernel, in seconds."},
	"process_cpu_seconds_total":                     {"counter", "CPU time, user and kernel, in seconds."},
	"process_cpu_seconds_user_total":                {"counter", "CPU time in user space, in seconds."},
	"process_io_read_bytes_total":                   {"counter", "Bytes read by read-like system calls."},
	"process_io_read_syscalls_total":                {"counter", "Read-like system calls."},
	"process_io_storage_read_bytes_total":           {"counter", "Bytes read from storage."},
	"process_io_storage_written_bytes_total":        {"counter", "Bytes written to storage."},
	"process_io_write_syscalls_total":               {"counter", "Write-like system calls."},
	"process_io_written_bytes_total":                {"counter", "Bytes written by write-like system calls."},
	"process_major_pagefaults_total":                {"counter", "Page faults that needed a disk read."},
	"process_max_fds":                               {"gauge", "Most file descriptors the process may open."},
	"process_minor_pagefaults_total":                {"counter", "Page faults served without a disk read."},
	"process_num_threads":                           {"gauge", "OS threads of the process."},
	"process_open_fds":                              {"gauge", "File descriptors the process has open."},
	"process_pressure_cpu_stalled_seconds_total":    {"counter", "Time all tasks of the cgroup stalled on CPU (PSI), in seconds."},
	"process_pressure_cpu_waiting_seconds_total":    {"counter", "Time some task of the cgroup waited for CPU (PSI), in seconds."},
	"process_pressure_io_stalled_seconds_total":     {"counter", "Time all tasks of the cgroup stalled on I/O (PSI), in seconds."},
	"process_pressure_io_waiting_seconds_total":     {"counter", "Time some task of the cgroup waited for I/O (PSI), in seconds."},
	"process_pressure_memory_stalled_seconds_total": {"counter", "Time all tasks of the cgroup stalled on memory (PSI), in seconds."},
	"process_pressure_memory_waiting_seconds_total": {"counter", "Time some task of the cgroup waited for memory (PSI), in seconds."},
	"process_resident_memory_anon_bytes":            {"gauge", "Resident anonymous memory, in bytes."},
	"process_resident_memory_bytes":                 {"gauge", "Resident memory, in bytes."},
	"process_resident_memory_file_bytes":            {"gauge", "Resident file-backed memory, in bytes."},
	"process_resident_memory_peak_bytes":            {"gauge", "Peak resident memory, in bytes."},
	"process_resident_memory_shared_bytes":          {"gauge", "Resident shared memory, in bytes."},
	"process_start_time_seconds":                    {"gauge", "Unix time the process started."},
	"process_virtual_memory_bytes":                  {"gauge", "Virtual memory size, in bytes."},
	"process_virtual_memory_peak_bytes":             {"gauge", "Peak virtual memory size, in bytes."},
}

// writeProcessMetrics writes the listed Go runtime and process families,
// each with its HELP and TYPE lines.
func writeProcessMetrics(w io.Writer) {
	var raw bytes.Buffer
	vm.WriteProcessMetrics(&raw)
	vm.WriteFDMetrics(&raw)
	writeFamilies(w, raw.Bytes(), procFamilies)
}

// writeFamilies copies the sample lines of samples whose family is in
// families, each family preceded by its HELP and TYPE lines, and drops the
// others (and any comment line).
func writeFamilies(w io.Writer, samples []byte, families map[string][2]string) {
	bw := bufio.NewWriter(w)
	cur := ""
	for line := range bytes.Lines(samples) {
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		s := string(line)
		name := s[:max(0, strings.IndexAny(s, "{ "))]
		f, ok := families[name]
		if !ok {
			// A summary's _sum and _count belong to it.
			for _, sfx := range []string{"_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, sfx); cut {
					if bf, found := families[base]; found && bf[0] == "summary" {
						f, ok, name = bf, true, base
					}
				}
			}
		}
		if !ok {
			continue
		}
		if name != cur {
			bw.WriteString("# HELP " + name + " " + escapeHelp(f[1]) + "\n")
			bw.WriteString("# TYPE " + name + " " + f[0] + "\n")
			cur = name
		}
		bw.Write(line)
	}
	bw.Flush()
}
