// Package segment defines what an engine publishes about its memory (Desc,
// BufferDesc, with Mooncake's JSON field names) and the registry of local
// memory that every remote access is checked against.
//
// The registry is read on every access, so lookups are lock-free binary
// searches over an immutable snapshot; registration replaces the snapshot.
// Acquire/Release count in-flight accesses so unregistering can wait for them
// before the memory is given back.
package segment
