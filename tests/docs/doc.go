// Package docs checks docs/: the API reference pages are what docs/gen.py
// makes of include/te.h and the Python docstrings, the troubleshooting page
// covers every error code of te.h, and the pages README.md links to exist.
package docs
