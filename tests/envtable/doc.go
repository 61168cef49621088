// Package envtable checks README.md's "Environment" table against the code:
// every environment variable te's code reads is in the table and every
// variable in the table is read, and each value the table's last column
// gives as refused is refused, naming the variable, by the component that
// reads it (engine creation, te-sidecar's option parsing). The Python-side
// rows are checked by python/tests/test_ops.py.
package envtable
