// Package redis is te's redis metadata store, opened by the connection string
// redis://host:port (Mooncake's form), or rediss://host:port for TLS.
// Credentials and database come from Mooncake's environment variables
// MC_REDIS_USERNAME (an ACL user; default: the default user),
// MC_REDIS_PASSWORD (its password, or the server's requirepass) and
// MC_REDIS_DB_INDEX (0..255), or from the URL
// (redis://user:pass@host:port/db), which wins. With rediss://,
// TE_REDIS_CACERT names a PEM file with the CAs that sign the server's
// certificate (default: the system's), and TE_REDIS_CERT and TE_REDIS_KEY a
// client certificate and its key for a server with tls-auth-clients
// (Mooncake has no variables for redis TLS); setting them with redis:// is
// refused. Refused credentials (NOAUTH, WRONGPASS, NOPERM) and failing TLS
// connections are Metadata errors whose hint names what to set. Settings go
// in the query:
//
//   - ttl: keys expire this long after their engine stopped refreshing them
//     (default 10s), so a dead engine's segment disappears, as with etcd's
//     leases; ttl=0 keeps keys forever, as Mooncake does.
//   - timeout: bound on one request when the caller's context has none
//     (default 3s).
//   - refresh: how often owned keys are refreshed (default ttl/3, or 5s
//     with ttl=0); a key the server lost (a restart without persistence) is
//     written again.
//   - cluster: namespace, as Mooncake's MC_METADATA_CLUSTER_ID (which is read
//     when the query does not set it).
//
// Values are plain strings under Mooncake's keys, so Mooncake engines read
// te's segments and the other way round.
//
// Importing this package registers the "redis" scheme with package meta;
// package engine imports it.
package redis
