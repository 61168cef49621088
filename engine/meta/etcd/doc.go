// Package etcd is te's etcd metadata store, opened by the connection string
// etcd://h1:p1,h2:p2 (Mooncake's form), or etcds://h1:p1,h2:p2 for TLS, with
// optional settings in the query:
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
// # Security
//
// etcds:// speaks TLS to etcd. TE_ETCD_CACERT names a PEM file with the CAs
// that sign etcd's certificates (default: the system's); TE_ETCD_CERT and
// TE_ETCD_KEY a client certificate and its key, for an etcd started with
// --client-cert-auth. Setting them with etcd:// is refused rather than
// ignored. TE_ETCD_USER and TE_ETCD_PASSWORD authenticate to an etcd with
// authentication enabled (etcdctl auth enable), with either scheme; over
// etcd:// the password crosses the network in clear, so use etcds:// where
// the network is not trusted. The user needs read and write access to te's
// keys (mooncake/...); with a user, opening the store authenticates at once,
// so etcd must be reachable then. Refused credentials, a failing TLS connection and a
// plaintext client of a TLS server fail each operation within its timeout
// with a Metadata error whose hint names what to check. (Mooncake's
// transfer engine reads no etcd credentials; te's variables are its own.)
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
// "etcd://..."}) works as is. It registers "etcds" too.
package etcd
