// Package promcheck checks a metrics exposition in Prometheus's text format
// the way `promtool check metrics` does: it parses the text and runs
// client_golang's promlint (the linter promtool uses) over it, then checks
// that every family has HELP and TYPE lines. Tests of everything that serves
// /metrics use it; no binary links it.
package promcheck
