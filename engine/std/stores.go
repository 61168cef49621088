package std

// The metadata stores an engine can use besides P2PHANDSHAKE and mem:// are
// imported by stores_*.go, one file per store; each store registers its
// scheme with package meta in init, so a connection string such as
// etcd://h:p works without further imports.
//
// They cost binary size (libte.so, stripped, measured with Go 1.26: 4.4 MB
// without any, 25.8 MB with all three; the etcd client's gRPC stack is most
// of it). A build that does not need one leaves it out with a tag:
// te_noetcd, te_nohttpmeta, te_noredis (e.g. go build -tags te_noetcd,te_noredis);
// its scheme then fails to open with a NotSupported error.
