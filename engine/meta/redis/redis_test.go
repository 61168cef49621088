package redis_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/meta/internal/storetest"
	"github.com/tecache/te/engine/meta/redis"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) { storetest.Main(m) }

func TestEngines(t *testing.T) {
	srv := storetest.Redis(t)
	storetest.Run(t, storetest.Setup{
		// A restarted redis (no persistence) forgets every key: the
		// engines' stores write theirs again at the next refresh.
		Conn:    "redis://" + srv.Addr() + "?ttl=2&refresh=500ms",
		Down:    srv.Stop,
		Up:      srv.Start,
		Expires: 2 * time.Second,
	})
}

func open(t *testing.T, conn string) *redis.Store {
	t.Helper()
	s, err := redis.Open(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cmd sends one command in RESP and returns the first line of the answer,
// to check what the server holds without the store's code.
func cmd(t *testing.T, addr string, args ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	c.Write([]byte(b.String()))
	buf := make([]byte, 4096)
	n, _ := c.Read(buf)
	return strings.TrimSpace(string(buf[:n]))
}

func TestStore(t *testing.T) {
	srv := storetest.Redis(t)
	ctx := context.Background()
	// A TTL ten refreshes long: the key must survive a loaded machine
	// delaying the refresher by seconds.
	s := open(t, "redis://"+srv.Addr()+"?ttl=3&refresh=300ms&cluster=c9")
	if _, err := s.Get(ctx, meta.KeyRAM("x")); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("missing key: %v", err)
	}
	if err := s.Put(ctx, meta.KeyRAM("x"), []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, meta.KeyRAM("x")); err != nil || string(v) != `{"a":1}` {
		t.Fatalf("get: %q %v", v, err)
	}
	// Mooncake's key with the cluster id, a plain string, with a TTL.
	if got := cmd(t, srv.Addr(), "GET", "mooncake/c9/ram/x"); !strings.HasSuffix(got, `{"a":1}`) {
		t.Fatalf("raw GET: %q", got)
	}
	if got := cmd(t, srv.Addr(), "PTTL", "mooncake/c9/ram/x"); got == ":-1" || got == ":-2" {
		t.Fatalf("PTTL %s: want a TTL", got)
	}
	storetest.Holds(t, 3500*time.Millisecond, "kept alive past the TTL", func() error {
		v, err := s.Get(ctx, meta.KeyRAM("x"))
		if err == nil && string(v) != `{"a":1}` {
			err = fmt.Errorf("value %q", v)
		}
		return err
	})
	// Deleted keys stay deleted, also after refreshes.
	if err := s.Delete(ctx, meta.KeyRAM("x")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, meta.KeyRAM("x")); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	storetest.Holds(t, time.Second, "deleted key stays deleted over refreshes", func() error {
		if _, err := s.Get(ctx, meta.KeyRAM("x")); errs.CodeOf(err) != errs.NotFound {
			return fmt.Errorf("deleted key: %v", err)
		}
		return nil
	})
	// ttl=0: no expiry, as Mooncake writes.
	p := open(t, "redis://"+srv.Addr()+"?ttl=0")
	p.Put(ctx, "k0", []byte("v"))
	if got := cmd(t, srv.Addr(), "PTTL", "k0"); got != ":-1" {
		t.Fatalf("PTTL with ttl=0: %s", got)
	}
	s.Close()
	if err := s.Put(ctx, "k", nil); errs.CodeOf(err) != errs.Closed {
		t.Fatalf("put on a closed store: %v", err)
	}
}

// TestAuth: Mooncake's variables for user, password and database.
func TestAuth(t *testing.T) {
	srv := storetest.Redis(t, "--requirepass", "pw1")
	ctx := context.Background()
	s := open(t, "redis://"+srv.Addr())
	err := s.Put(ctx, "k", []byte("v"))
	if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), redis.EnvPassword) {
		t.Fatalf("no password: %v", err)
	}
	t.Setenv(redis.EnvPassword, "pw1")
	t.Setenv(redis.EnvDBIndex, "3")
	s3 := open(t, "redis://"+srv.Addr())
	if err := s3.Put(ctx, "k", []byte("v3")); err != nil {
		t.Fatal(err)
	}
	// The value is in database 3, not 0.
	if got := cmd(t, srv.Addr(), "AUTH", "pw1"); got != "+OK" {
		t.Fatal(got)
	}
	s0 := open(t, "redis://:pw1@"+srv.Addr()+"/0")
	if _, err := s0.Get(ctx, "k"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("database 0 has the key: %v", err)
	}
	if v, err := open(t, "redis://default:pw1@"+srv.Addr()+"/3").Get(ctx, "k"); err != nil || string(v) != "v3" {
		t.Fatalf("database 3: %q %v", v, err)
	}
	t.Setenv(redis.EnvDBIndex, "256")
	if _, err := redis.Open("redis://" + srv.Addr()); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatalf("db index 256: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	s := open(t, fmt.Sprintf("redis://127.0.0.1:%d?timeout=300ms", storetest.FreePort(t)))
	t0 := time.Now()
	_, err := s.Get(context.Background(), "k")
	if c := errs.CodeOf(err); c != errs.Metadata && c != errs.Timeout {
		t.Fatalf("get from nowhere: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second { // a few times the 300 ms timeout, not a hang
		t.Fatalf("took %v", d)
	}
}

func TestOpenErrors(t *testing.T) {
	for _, c := range []string{"redis://", "redis://h", "redis://h:1/x", "redis://h:1/300", "redis://h:1?ttl=500ms",
		"redis://h:1?ttl=2&refresh=3s", "redis://h:1?timeout=0"} {
		if s, err := meta.Open(c); errs.CodeOf(err) != errs.InvalidArgument {
			if s != nil {
				s.Close()
			}
			t.Errorf("%q: %v, want InvalidArgument", c, err)
		}
	}
}

func ExampleOpen() {
	// Mooncake's variables give the credentials and database; ttl=0 keeps
	// keys without expiry, as Mooncake writes them.
	s, err := redis.Open("redis://127.0.0.1:6379?ttl=0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	_, err = redis.Open("redis://127.0.0.1:6379/999")
	fmt.Println(errs.CodeOf(err))
	// Output: invalid argument
}

func BenchmarkGet(b *testing.B) {
	srv := storetest.Redis(b)
	s, err := redis.Open("redis://" + srv.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.BenchGet(b, s)
}

// TestACLUser: an ACL user (Mooncake's MC_REDIS_USERNAME and
// MC_REDIS_PASSWORD) with access to Mooncake's keys only; a wrong password
// and a user without write access fail at once with Metadata errors that say
// what to fix; engines work through the store.
func TestACLUser(t *testing.T) {
	srv := storetest.Redis(t, "--user", "default", "off",
		"--user", "te", "on", ">te-password", "~mooncake/*", "+@all",
		"--user", "reader", "on", ">reader-password", "~mooncake/*", "+@read", "+@connection")
	conn := "redis://" + srv.Addr() + "?ttl=2&refresh=500ms&timeout=1s"
	ctx := context.Background()
	for _, c := range []struct{ user, pass, hint string }{
		{"", "", redis.EnvPassword}, {"te", "wrong", redis.EnvPassword}, {"reader", "reader-password", "grant"},
	} {
		t.Setenv(redis.EnvUsername, c.user)
		t.Setenv(redis.EnvPassword, c.pass)
		s := open(t, conn)
		t0 := time.Now()
		err := s.Put(ctx, meta.KeyRAM("x"), []byte("v"))
		if errs.CodeOf(err) != errs.Metadata || !strings.Contains(err.Error(), c.hint) || time.Since(t0) > 5*time.Second {
			t.Fatalf("user %q password %q: %v after %v", c.user, c.pass, err, time.Since(t0))
		}
		t.Logf("user %q: %v", c.user, err)
	}
	t.Setenv(redis.EnvUsername, "te")
	t.Setenv(redis.EnvPassword, "te-password")
	s := open(t, conn)
	if err := s.Put(ctx, meta.KeyRAM("x"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, meta.KeyRAM("x")); err != nil || string(v) != "v" {
		t.Fatalf("get: %q %v", v, err)
	}
	// Engines here and in a child process (which inherits the variables).
	storetest.Run(t, storetest.Setup{Conn: conn, Expires: 2 * time.Second})
}

// TestTLS: redis serving TLS only and requiring client certificates. With
// rediss:// and TE_REDIS_CACERT, TE_REDIS_CERT and TE_REDIS_KEY engines work;
// without a client certificate, with one from another authority or over
// plaintext, operations fail at once with a Metadata error.
func TestTLS(t *testing.T) {
	p := storetest.NewPKI(t)
	srv := storetest.RedisTLS(t, p, "--requirepass", "pw")
	t.Setenv(redis.EnvPassword, "pw")
	conn := "rediss://" + srv.Addr() + "?ttl=2&refresh=500ms&timeout=1s"
	ctx := context.Background()
	t.Setenv(redis.EnvCACert, p.CA)
	for _, c := range []struct{ name, cert, key string }{{"no client certificate", "", ""}, {"another authority's", p.RogueCert, p.RogueKey}} {
		t.Setenv(redis.EnvCert, c.cert)
		t.Setenv(redis.EnvKey, c.key)
		s := open(t, conn)
		t0 := time.Now()
		_, err := s.Get(ctx, "k")
		if c := errs.CodeOf(err); (c != errs.Metadata && c != errs.Timeout) || !strings.Contains(err.Error(), redis.EnvCert) || time.Since(t0) > 5*time.Second {
			t.Fatalf("%s: %v after %v", c, err, time.Since(t0))
		}
		t.Logf("%s: %v", c.name, err)
	}
	t.Setenv(redis.EnvCert, p.ClientCert)
	t.Setenv(redis.EnvKey, p.ClientKey)
	s := open(t, conn)
	if err := s.Put(ctx, meta.KeyRAM("x"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, meta.KeyRAM("x")); err != nil || string(v) != "v" {
		t.Fatalf("get: %q %v", v, err)
	}
	storetest.Run(t, storetest.Setup{Conn: conn, Expires: 2 * time.Second})

	if _, err := redis.Open("redis://" + srv.Addr()); errs.CodeOf(err) != errs.InvalidArgument || !strings.Contains(err.Error(), "rediss://") {
		t.Fatalf("redis:// with TLS files: %v", err)
	}
	t.Setenv(redis.EnvCACert, "")
	t.Setenv(redis.EnvCert, "")
	t.Setenv(redis.EnvKey, "")
	plain := open(t, "redis://"+srv.Addr()+"?timeout=1s")
	t0 := time.Now()
	if _, err := plain.Get(ctx, "k"); errs.CodeOf(err) == errs.OK || errs.CodeOf(err) == errs.NotFound || time.Since(t0) > 5*time.Second {
		t.Fatalf("plaintext to a TLS server: %v after %v", err, time.Since(t0))
	}
}
