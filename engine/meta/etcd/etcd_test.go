package etcd_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/meta/etcd"
	"github.com/tecache/te/engine/meta/internal/storetest"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) { storetest.Main(m) }

func TestEngines(t *testing.T) {
	srv := storetest.Etcd(t)
	storetest.Run(t, storetest.Setup{
		Conn:    "etcd://" + srv.Addr() + "?ttl=2",
		Down:    srv.Stop,
		Up:      srv.Start,
		Expires: 2 * time.Second,
		Watch:   true,
	})
}

// TestOutageWiped restarts etcd without its data: the lease and every key
// are gone, and the engines must take a new lease and publish again.
func TestOutageWiped(t *testing.T) {
	srv := storetest.Etcd(t)
	storetest.Outage(t, storetest.Setup{
		Conn: "etcd://" + srv.Addr() + "?ttl=2",
		Down: srv.Stop,
		Up:   func() { srv.Wipe(); srv.Start() },
	})
}

func raw(t *testing.T, addr string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func open(t *testing.T, conn string) *etcd.Store {
	t.Helper()
	s, err := etcd.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	srv := storetest.Etcd(t)
	ctx := context.Background()
	s := open(t, "etcd://"+srv.Addr()+"?ttl=3")
	if _, err := s.Get(ctx, "mooncake/ram/x"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("missing key: %v", err)
	}
	if err := s.Put(ctx, "mooncake/ram/x", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "mooncake/ram/x"); err != nil || string(v) != "v1" {
		t.Fatalf("get: %q %v", v, err)
	}
	// The key lives under a lease with the configured TTL.
	r, err := raw(t, srv.Addr()).Get(ctx, "mooncake/ram/x")
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease == 0 {
		t.Fatalf("raw key: %+v %v", r, err)
	}
	ttl, err := raw(t, srv.Addr()).TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 3 {
		t.Fatalf("lease: %+v %v", ttl, err)
	}
	storetest.Holds(t, 4*time.Second, "kept alive past the TTL", func() error {
		v, err := s.Get(ctx, "mooncake/ram/x")
		if err == nil && string(v) != "v1" {
			err = fmt.Errorf("value %q", v)
		}
		return err
	})
	if err := s.Delete(ctx, "mooncake/ram/x"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "mooncake/ram/x"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if _, err := s.Get(ctx, "mooncake/ram/x"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("deleted key: %v", err)
	}
	// Close revokes the lease: keys go at once, not after the TTL.
	s2, err := etcd.Open("etcd://" + srv.Addr() + "?ttl=30")
	if err != nil {
		t.Fatal(err)
	}
	s2.Put(ctx, "mooncake/ram/y", []byte("v"))
	s2.Close()
	if _, err := s.Get(ctx, "mooncake/ram/y"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("key of a closed store: %v", err)
	}
	if err := s2.Put(ctx, "k", nil); errs.CodeOf(err) != errs.Closed {
		t.Fatalf("put on a closed store: %v", err)
	}
}

func TestCluster(t *testing.T) {
	srv := storetest.Etcd(t)
	ctx := context.Background()
	a := open(t, "etcd://"+srv.Addr()+"?cluster=prod")
	t.Setenv("MC_METADATA_CLUSTER_ID", "dev/")
	b := open(t, "etcd://"+srv.Addr())
	if err := a.Put(ctx, meta.KeyRAM("seg"), []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, meta.KeyRAM("seg"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if v, _ := a.Get(ctx, meta.KeyRAM("seg")); string(v) != "a" {
		t.Fatalf("cluster prod sees %q", v)
	}
	if v, _ := b.Get(ctx, meta.KeyRAM("seg")); string(v) != "b" {
		t.Fatalf("cluster dev sees %q", v)
	}
	r, err := raw(t, srv.Addr()).Get(ctx, "mooncake/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range r.Kvs {
		keys = append(keys, string(kv.Key))
	}
	sort.Strings(keys)
	if fmt.Sprint(keys) != "[mooncake/dev/ram/seg mooncake/prod/ram/seg]" {
		t.Fatalf("stored keys %v: want Mooncake's mooncake/<cluster>/ram/<name>", keys)
	}
}

func TestWatch(t *testing.T) {
	srv := storetest.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := open(t, "etcd://"+srv.Addr()+"?cluster=c1")
	s := open(t, "etcd://"+srv.Addr()+"?cluster=c1")
	var mu sync.Mutex
	var got []string
	if err := w.Watch(ctx, meta.KeyRAM(""), func(k string) {
		mu.Lock()
		got = append(got, k)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	s.Put(ctx, meta.KeyRAM("a"), []byte("1"))
	s.Put(ctx, meta.KeyRPC("a"), []byte("1")) // not under the prefix
	s.Delete(ctx, meta.KeyRAM("a"))
	// The put and the delete, each once; or, where the watch was set up
	// again meanwhile (a client that saw its connection drop, as on a
	// loaded machine), the prefix itself, which says every key counts as
	// changed (meta.Watcher), in place of what it may have missed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		g := fmt.Sprint(got)
		resynced, others := false, true
		for _, k := range got {
			switch k {
			case meta.KeyRAM(""):
				resynced = true
			case meta.KeyRAM("a"):
			default:
				others = false
			}
		}
		mu.Unlock()
		if g == "[mooncake/ram/a mooncake/ram/a]" || resynced && others {
			if resynced {
				t.Logf("the watch was set up again: %s", g)
			}
			break
		}
		if !others || time.Now().After(deadline) {
			t.Fatalf("watch saw %s", g)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUnreachable(t *testing.T) {
	port := storetest.FreePort(t)
	s := open(t, fmt.Sprintf("etcd://127.0.0.1:%d?timeout=300ms", port))
	t0 := time.Now()
	_, err := s.Get(context.Background(), "k")
	if c := errs.CodeOf(err); c != errs.Timeout && c != errs.Metadata {
		t.Fatalf("get from nowhere: %v", err)
	}
	err = s.Put(context.Background(), "k", []byte("v"))
	if c := errs.CodeOf(err); c != errs.Timeout && c != errs.Metadata {
		t.Fatalf("put to nowhere: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second { // a few times the 300 ms timeout, not a hang
		t.Fatalf("failing took %v", d)
	}
	t.Log(err)
}

func TestOpenErrors(t *testing.T) {
	for _, c := range []string{"etcd://", "etcd://h:1?ttl=0", "etcd://h:1?ttl=-1", "etcd://h:1?timeout=x",
		"etcd://h:1?ttl=500ms", "etcd://h:1?%zz", "etcd://h:1?retries=1000"} {
		if s, err := meta.Open(c); errs.CodeOf(err) != errs.InvalidArgument {
			if s != nil {
				s.Close()
			}
			t.Errorf("%q: %v, want InvalidArgument", c, err)
		}
	}
}

func ExampleOpen() {
	// Keys live under a 5 s lease in cluster "prod"'s namespace; Open does
	// not wait for etcd, the first operations report an unreachable one.
	s, err := etcd.Open("etcd://127.0.0.1:2379?ttl=5s&cluster=prod")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	_, err = etcd.Open("etcd://127.0.0.1:2379?ttl=500ms")
	fmt.Println(errs.CodeOf(err))
	// Output: invalid argument
}

// TestWatchAfterRestart: etcd comes back without its data (revisions start
// over). The watch must be set up again, report that everything may have
// changed, and see the changes made after the restart.
func TestWatchAfterRestart(t *testing.T) {
	srv := storetest.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn := "etcd://" + srv.Addr() + "?ttl=2&timeout=1s"
	w := open(t, conn)
	var mu sync.Mutex
	var got []string
	w.Watch(ctx, meta.KeyRAM(""), func(k string) {
		mu.Lock()
		got = append(got, k)
		mu.Unlock()
	})
	s := open(t, conn)
	// Advance the revision, so a resumed watch would wait for revisions
	// the fresh etcd reaches only much later.
	for i := 0; i < 20; i++ {
		s.Put(ctx, "other", []byte(fmt.Sprint(i)))
	}
	srv.Stop()
	srv.Wipe()
	srv.Start()
	saw := func(want string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range got {
			if k == want {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(10 * time.Second)
	for !saw(meta.KeyRAM("")) {
		if time.Now().After(deadline) {
			t.Fatal("no everything-changed call after the reconnection")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Put(ctx, meta.KeyRAM("fresh"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	for !saw(meta.KeyRAM("fresh")) {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("watch after the restart saw %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func BenchmarkGet(b *testing.B) {
	srv := storetest.Etcd(b)
	s, err := etcd.Open("etcd://" + srv.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchGet(b, s)
}

// enableAuth turns on etcd's authentication with a root user and a user
// "te" that may read and write every key.
func enableAuth(t *testing.T, addr string) {
	t.Helper()
	c := raw(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := c.RoleAdd(ctx, "te"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "te", "\x00", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.UserAdd(ctx, "te", "te-password"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "te", "te"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	}
	for i, f := range steps {
		if err := f(); err != nil {
			t.Fatalf("enabling auth, step %d: %v", i, err)
		}
	}
}

// quickly runs f and fails the test when it takes longer than d.
func quickly(t *testing.T, d time.Duration, f func() error) error {
	t.Helper()
	t0 := time.Now()
	err := f()
	if el := time.Since(t0); el > d {
		t.Fatalf("took %v (%v)", el, err)
	}
	return err
}

// TestUserPassword: etcd with authentication on. Without credentials or
// with a wrong password every operation fails with a Metadata error at
// once; with TE_ETCD_USER and TE_ETCD_PASSWORD engines work as usual.
func TestUserPassword(t *testing.T) {
	srv := storetest.Etcd(t)
	enableAuth(t, srv.Addr())
	conn := "etcd://" + srv.Addr() + "?ttl=2&timeout=1s"
	ctx := context.Background()

	s := open(t, conn)
	err := quickly(t, 5*time.Second, func() error { return s.Put(ctx, "k", []byte("v")) })
	if errs.CodeOf(err) != errs.Metadata {
		t.Fatalf("put without credentials: %v", err)
	}
	t.Log("without credentials:", err)

	t.Setenv(etcd.EnvUser, "te")
	t.Setenv(etcd.EnvPassword, "wrong-password")
	err = quickly(t, 5*time.Second, func() error {
		s, err := etcd.Open(conn)
		if err == nil {
			defer s.Close()
			err = s.Put(ctx, "k", []byte("v"))
		}
		return err
	})
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("wrong password: %v", err)
	}
	t.Log("wrong password:", err)

	t.Setenv(etcd.EnvPassword, "te-password")
	good := open(t, conn)
	if err := good.Put(ctx, meta.KeyRAM("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, err := good.Get(ctx, meta.KeyRAM("a")); err != nil || string(v) != "1" {
		t.Fatalf("get: %q %v", v, err)
	}
	// Engines in this process and in a child process (which inherits the
	// variables) find each other, and a killed one's lease expires.
	storetest.Run(t, storetest.Setup{Conn: conn, Expires: 2 * time.Second, Watch: true})

	t.Setenv(etcd.EnvPassword, "")
	if _, err := etcd.Open(conn); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("user without password: %v", err)
	}
}

// TestTLS: etcd over TLS with client certificates (--client-cert-auth).
// With TE_ETCD_CACERT, TE_ETCD_CERT and TE_ETCD_KEY engines work through
// etcds://; without a client certificate, with one from another authority
// or over plaintext, operations fail at once with a Metadata error.
func TestTLS(t *testing.T) {
	p := storetest.NewPKI(t)
	srv := storetest.EtcdTLS(t, p)
	conn := "etcds://" + srv.Addr() + "?ttl=2&timeout=1s"
	ctx := context.Background()
	t.Setenv(etcd.EnvCACert, p.CA)
	for _, c := range []struct{ name, cert, key string }{{"no client certificate", "", ""}, {"another authority's", p.RogueCert, p.RogueKey}} {
		t.Setenv(etcd.EnvCert, c.cert)
		t.Setenv(etcd.EnvKey, c.key)
		err := quickly(t, 5*time.Second, func() error {
			s, err := etcd.Open(conn)
			if err == nil {
				defer s.Close()
				_, err = s.Get(ctx, "k")
			}
			return err
		})
		if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), etcd.EnvCert) {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: %v", c.name, err)
	}
	t.Setenv(etcd.EnvCert, p.ClientCert)
	t.Setenv(etcd.EnvKey, p.ClientKey)
	s := open(t, conn)
	if err := s.Put(ctx, meta.KeyRAM("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, meta.KeyRAM("a")); err != nil || string(v) != "1" {
		t.Fatalf("get: %q %v", v, err)
	}
	storetest.Run(t, storetest.Setup{Conn: conn, Expires: 2 * time.Second, Watch: true})

	// Plaintext to a TLS server fails; TLS files with etcd:// are a
	// mistake said at once; unreadable files too.
	if _, err := etcd.Open("etcd://" + srv.Addr()); errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "etcds://") {
		t.Fatalf("etcd:// with TLS files: %v", err)
	}
	t.Setenv(etcd.EnvKey, p.ClientCert)
	if _, err := etcd.Open(conn); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("a key that is not a key: %v", err)
	}
	t.Setenv(etcd.EnvCACert, p.CA+".missing")
	if _, err := etcd.Open(conn); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("a missing CA file: %v", err)
	}
	t.Setenv(etcd.EnvCACert, "")
	t.Setenv(etcd.EnvCert, "")
	t.Setenv(etcd.EnvKey, "")
	plain := open(t, "etcd://"+srv.Addr()+"?timeout=1s")
	err := quickly(t, 5*time.Second, func() error { _, err := plain.Get(ctx, "k"); return err })
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), "etcds://") {
		t.Fatalf("plaintext to a TLS server: %v", err)
	}
}
