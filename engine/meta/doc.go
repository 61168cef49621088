// Package meta is te's metadata layer: the Store interface behind every
// metadata service, Mooncake's key names, and connection-string parsing.
//
// The default, P2PHANDSHAKE, needs no server: a segment's name is its engine's
// RPC address and the descriptor is fetched from the peer itself. Stores for
// etcd, Mooncake's HTTP protocol and redis register their schemes with
// RegisterScheme (RegisterSchemeWith for a store that takes Options, such as
// the cluster secret an engine passes with OpenWith).
package meta
