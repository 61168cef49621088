// Package mk tests the build scripts make test relies on: mk/suites.sh runs
// every suite whatever the others did and ends with a summary (checked with
// deliberately failing fake suites in a scratch makefile that includes the
// real one, never by breaking a real suite), mk/heartbeat.sh speaks up during
// long steps, and mk/version.sh prints te's version.
package mk
