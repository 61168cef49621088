// Package metautil holds what te's networked metadata stores share:
// connection-string options, Mooncake's cluster-id key prefix, the record of
// keys a store owns (so it can publish them again after an outage) and retry
// with backoff.
package metautil

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tecache/te/internal/errs"
)

// EnvClusterID is Mooncake's variable for a cluster namespace: keys
// mooncake/X become mooncake/<id>/X, so clusters sharing one store never see
// each other's segments.
const EnvClusterID = "MC_METADATA_CLUSTER_ID"

// Options are the settings every store reads from its connection string's
// query (te's extension of Mooncake's strings) and the environment.
type Options struct {
	// Hosts is the part between "scheme://" and the first '/' or '?'.
	Hosts string
	// Path is the URL path, "" when absent.
	Path string
	// Cluster is the cluster id (?cluster=, else $MC_METADATA_CLUSTER_ID).
	Cluster string
	// TTL is how long a dead engine's keys outlive it (?ttl=).
	TTL time.Duration
	// Timeout bounds one request to the store (?timeout=).
	Timeout time.Duration
	// Refresh is how often owned keys are checked and published again
	// (?refresh=).
	Refresh time.Duration
	// Retries is how many times a failed request is tried again (?retries=).
	Retries int
	// Query holds every query parameter, for store-specific ones.
	Query url.Values
}

// Parse splits conn ("scheme://hosts/path?k=v") into Options, starting from
// def for whatever the string does not set. Durations are Go durations
// ("1500ms") or plain seconds ("3").
func Parse(scheme, conn string, def Options) (Options, error) {
	o := def
	rest, ok := strings.CutPrefix(conn, scheme+"://")
	if !ok {
		return o, errs.New(errs.InvalidArgument, "metadata", "connection string %q does not start with %s://", conn, scheme)
	}
	rest, query, _ := strings.Cut(rest, "?")
	o.Hosts, o.Path, _ = strings.Cut(rest, "/")
	if strings.Contains(rest, "/") {
		o.Path = "/" + o.Path
	}
	if o.Hosts == "" {
		return o, errs.New(errs.InvalidArgument, "metadata", "connection string %q names no host", conn)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return o, errs.Wrap(errs.InvalidArgument, "metadata", err, "query of %q", conn)
	}
	o.Query = q
	o.Cluster = os.Getenv(EnvClusterID)
	if v := q.Get("cluster"); v != "" {
		o.Cluster = v
	}
	if strings.ContainsAny(o.Cluster, "\x00") {
		return o, errs.New(errs.InvalidArgument, "metadata", "invalid cluster id %q", o.Cluster)
	}
	for _, d := range []struct {
		name string
		p    *time.Duration
		zero bool // zero is a meaningful value
	}{{"ttl", &o.TTL, true}, {"timeout", &o.Timeout, false}, {"refresh", &o.Refresh, false}} {
		v := q.Get(d.name)
		if v == "" {
			continue
		}
		x, err := ParseDuration(v)
		if err != nil || x < 0 || (x == 0 && !d.zero) {
			return o, errs.New(errs.InvalidArgument, "metadata", "%s=%q in %q is not a positive duration", d.name, v, conn)
		}
		*d.p = x
	}
	if v := q.Get("retries"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			return o, errs.New(errs.InvalidArgument, "metadata", "retries=%q in %q is not 0..100", v, conn)
		}
		o.Retries = n
	}
	return o, nil
}

// ParseDuration reads a Go duration or a number of seconds.
func ParseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		if n < 0 || n > 1e6 {
			return 0, errs.New(errs.InvalidArgument, "metadata", "duration %q out of range", s)
		}
		return time.Duration(n * float64(time.Second)), nil
	}
	return time.ParseDuration(s)
}

// Prefix maps te's (Mooncake's) keys into a cluster's namespace and back.
type Prefix struct{ cluster string }

// NewPrefix returns the mapping for cluster ("" maps keys to themselves).
func NewPrefix(cluster string) Prefix {
	return Prefix{strings.Trim(cluster, "/")}
}

const root = "mooncake/"

// Key returns the key as stored: mooncake/X becomes mooncake/<cluster>/X,
// as Mooncake writes it when MC_METADATA_CLUSTER_ID is set.
func (p Prefix) Key(k string) string {
	if p.cluster == "" {
		return k
	}
	if rest, ok := strings.CutPrefix(k, root); ok {
		return root + p.cluster + "/" + rest
	}
	return k
}

// Unkey is the inverse of Key, for keys read back from the store (watch
// events).
func (p Prefix) Unkey(k string) string {
	if p.cluster == "" {
		return k
	}
	if rest, ok := strings.CutPrefix(k, root+p.cluster+"/"); ok {
		return root + rest
	}
	return k
}

// Owned records what a store's client has written, so that it can write it
// again when the store lost it (a restarted server, an expired lease) and
// retry deletes that failed. The zero value is not usable; use NewOwned.
type Owned struct {
	mu    sync.Mutex
	want  map[string][]byte
	dirty map[string]bool // written locally, not yet confirmed by the store
	dels  map[string]bool // deleted locally, not yet confirmed
}

// NewOwned returns an empty record.
func NewOwned() *Owned {
	return &Owned{want: map[string][]byte{}, dirty: map[string]bool{}, dels: map[string]bool{}}
}

// Put records that key should hold value (not yet confirmed).
func (o *Owned) Put(key string, value []byte) {
	o.mu.Lock()
	o.want[key] = append([]byte(nil), value...)
	o.dirty[key] = true
	delete(o.dels, key)
	o.mu.Unlock()
}

// Delete records that key should be gone (not yet confirmed).
func (o *Owned) Delete(key string) {
	o.mu.Lock()
	delete(o.want, key)
	delete(o.dirty, key)
	o.dels[key] = true
	o.mu.Unlock()
}

// Confirm records that the store now holds what was asked for key, if value
// is still what is wanted (nil value: the delete went through).
func (o *Owned) Confirm(key string, value []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if value == nil {
		delete(o.dels, key)
		return
	}
	if w, ok := o.want[key]; ok && string(w) == string(value) {
		delete(o.dirty, key)
	}
}

// Lost marks every owned key as needing a write (the store forgot them).
func (o *Owned) Lost() {
	o.mu.Lock()
	for k := range o.want {
		o.dirty[k] = true
	}
	o.mu.Unlock()
}

// Lose marks one owned key as needing a write (the store no longer has it);
// a key deleted meanwhile stays deleted.
func (o *Owned) Lose(key string) {
	o.mu.Lock()
	if _, ok := o.want[key]; ok {
		o.dirty[key] = true
	}
	o.mu.Unlock()
}

// Entry is one pending write (Value nil: a delete).
type Entry struct {
	Key   string
	Value []byte
}

// Pending returns the unconfirmed writes and deletes.
func (o *Owned) Pending() []Entry {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Entry
	for k := range o.dirty {
		out = append(out, Entry{k, o.want[k]})
	}
	for k := range o.dels {
		out = append(out, Entry{Key: k})
	}
	return out
}

// Replay writes the unconfirmed puts and deletes through put and del, each
// call bounded by timeout, and stops at the first failure (the store is
// still away: the next round tries again) or when ctx ends. The stores
// confirm what went through themselves, in put and del.
func (o *Owned) Replay(ctx context.Context, timeout time.Duration,
	put func(ctx context.Context, key string, value []byte) error, del func(ctx context.Context, key string) error) error {
	for _, e := range o.Pending() {
		if err := ctx.Err(); err != nil {
			return err
		}
		c, cancel := context.WithTimeout(ctx, timeout)
		var err error
		if e.Value == nil {
			err = del(c, e.Key)
		} else {
			err = put(c, e.Key, e.Value)
		}
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// All returns every owned key and value.
func (o *Owned) All() []Entry {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]Entry, 0, len(o.want))
	for k, v := range o.want {
		out = append(out, Entry{k, v})
	}
	return out
}

// Len returns how many keys are owned or pending deletion.
func (o *Owned) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.want) + len(o.dels)
}

// Retry calls f until it succeeds, says the error is final, attempts calls
// were made, or ctx ends; it waits with a doubling backoff from 50 ms between
// calls. It returns f's last error (or ctx's, if f never ran).
func Retry(ctx context.Context, attempts int, f func(ctx context.Context) (retry bool, err error)) error {
	if attempts < 1 {
		attempts = 1
	}
	wait := 50 * time.Millisecond
	var err error
	for i := 0; i < attempts; i++ {
		var again bool
		again, err = f(ctx)
		if err == nil || !again || i == attempts-1 {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		if wait *= 2; wait > time.Second {
			wait = time.Second
		}
	}
	return err
}

// Sleep waits d or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// TLSConfig builds a client TLS configuration from PEM files: caFile (the
// CAs that sign the server's certificate; empty: the system's) and a client
// certificate with its key (both or neither). op names the store in errors.
func TLSConfig(op, caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, op, err, "reading the CA certificates")
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, errs.New(errs.InvalidArgument, op, "no PEM certificate in %s", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errs.New(errs.InvalidArgument, op, "a client certificate needs its key and the other way round (got %q and %q)", certFile, keyFile)
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, errs.Wrap(errs.InvalidArgument, op, err, "loading the client certificate")
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}
