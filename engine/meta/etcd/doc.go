// Package etcd is te's etcd metadata store, opened by the connection string
// etcd://h1:p1,h2:p2 (Mooncake's form), with optional settings in the query:
//
//   - ttl: lease TTL (default 10s). Everything the store writes lives under
//     one lease that it keeps alive, so a dead engine's segment disappears
//     within the TTL. etcd needs at least 1s.
//   - timeout: bound on one request when the caller's context has none
//     (default 5s).
//   - cluster: namespace, as Mooncake's MC_METADATA_CLUSTER_ID (which is read
//     when the query does not set it): keys mooncake/X become
//     mooncake/<cluster>/X.
//
// For example:
//
//	etcd://10.0.0.1:2379,10.0.0.2:2379?ttl=10s&timeout=3s&cluster=prod
//
// The store survives etcd outages: the client reconnects by itself; when the
// lease was lost (etcd restarted without its data, or stayed away longer
// than the TTL), the store takes a fresh lease and writes again every key it
// owns, including those written while etcd was down. Store implements
// meta.Watcher, so engines invalidate cached descriptors as soon as a peer
// republishes or its lease expires.
//
// Importing this package registers the "etcd" scheme with package meta;
// package engine imports it, so engine.New(engine.Config{Metadata:
// "etcd://..."}) works as is.
package etcd
