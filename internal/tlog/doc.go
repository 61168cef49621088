// Package tlog is te's one log style: log/slog lines on stderr, text by
// default and JSON by option, with durations written as durations ("1.5s",
// also in JSON). The level and format come from TE_LOG_LEVEL and
// TE_LOG_FORMAT for every entry point (libte, the Go API when no Logger is
// given, te-bench, te-demo, te-sidecar).
package tlog
