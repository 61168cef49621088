// Package sigkeep keeps the process's signal handlers as they were across a
// call into foreign code that may replace them.
//
// Some libraries install handlers for fault signals when they are loaded:
// Debian's libfabric links the PSM providers, and libinfinipath's
// constructor installs a SIGSEGV/SIGBUS/SIGILL/SIGFPE handler that prints a
// backtrace and exits. In a Go process (a test binary, te-sidecar, or libte
// inside Python) that handler replaces the Go runtime's, so a fault Go would
// have turned into a recoverable panic (debug.SetPanicOnFault, which libte
// uses to refuse wild pointers from C) kills the process instead, and a
// host program's own handlers (Python's faulthandler) are lost too. Around
// runs such a call and puts back every disposition it changed.
package sigkeep
