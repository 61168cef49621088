package metautil

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

func TestParse(t *testing.T) {
	t.Setenv(EnvClusterID, "envc")
	o, err := Parse("etcd", "etcd://h1:1,h2:2/p?ttl=2.5&timeout=300ms&refresh=1s&retries=4&x=y", Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if o.Hosts != "h1:1,h2:2" || o.Path != "/p" || o.TTL != 2500*time.Millisecond || o.Timeout != 300*time.Millisecond ||
		o.Refresh != time.Second || o.Retries != 4 || o.Cluster != "envc" || o.Query.Get("x") != "y" {
		t.Fatalf("%+v", o)
	}
	o, err = Parse("etcd", "etcd://h?cluster=q&ttl=0", Options{TTL: time.Minute})
	if err != nil || o.Cluster != "q" || o.TTL != 0 || o.Path != "" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, c := range []string{"redis://h", "etcd://", "etcd://?ttl=1", "etcd://h?ttl=x", "etcd://h?ttl=-1",
		"etcd://h?timeout=0", "etcd://h?retries=-1", "etcd://h?retries=101", "etcd://h?%", "etcd://h?cluster=a%00b",
		"etcd://h?ttl=1e300"} {
		if _, err := Parse("etcd", c, Options{}); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("%q: %v", c, err)
		}
	}
}

func TestPrefix(t *testing.T) {
	p := NewPrefix("/prod/")
	for in, want := range map[string]string{
		"mooncake/ram/a":      "mooncake/prod/ram/a",
		"mooncake/rpc_meta/a": "mooncake/prod/rpc_meta/a",
		"other/x":             "other/x",
	} {
		if got := p.Key(in); got != want {
			t.Errorf("Key(%q) = %q, want %q", in, got, want)
		}
		if got := p.Unkey(want); got != in {
			t.Errorf("Unkey(%q) = %q, want %q", want, got, in)
		}
	}
	if NewPrefix("").Key("mooncake/ram/a") != "mooncake/ram/a" {
		t.Fatal("empty cluster changes keys")
	}
}

func pending(o *Owned) string {
	var s []string
	for _, e := range o.Pending() {
		s = append(s, fmt.Sprintf("%s=%s", e.Key, e.Value))
	}
	sort.Strings(s)
	return fmt.Sprint(s)
}

func TestOwned(t *testing.T) {
	o := NewOwned()
	o.Put("a", []byte("1"))
	o.Put("b", []byte("2"))
	if got := pending(o); got != "[a=1 b=2]" {
		t.Fatal(got)
	}
	o.Confirm("a", []byte("1"))
	o.Confirm("b", []byte("old")) // a stale confirmation does not count
	if got := pending(o); got != "[b=2]" {
		t.Fatal(got)
	}
	o.Confirm("b", []byte("2"))
	o.Delete("a")
	if got := pending(o); got != "[a=]" {
		t.Fatal(got)
	}
	o.Confirm("a", nil)
	o.Lose("a") // deleted: stays deleted
	if got := pending(o); got != "[]" {
		t.Fatal(got)
	}
	o.Lost()
	if got := pending(o); got != "[b=2]" || o.Len() != 1 || len(o.All()) != 1 {
		t.Fatal(got)
	}
}

func TestRetry(t *testing.T) {
	n := 0
	err := Retry(context.Background(), 3, func(context.Context) (bool, error) { n++; return true, errors.New("x") })
	if err == nil || n != 3 {
		t.Fatalf("%v after %d", err, n)
	}
	n = 0
	Retry(context.Background(), 5, func(context.Context) (bool, error) { n++; return false, errors.New("final") })
	if n != 1 {
		t.Fatalf("final error retried: %d", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	Retry(ctx, 1000, func(context.Context) (bool, error) { return true, errors.New("x") })
	if d := time.Since(t0); d > 5*time.Second { // 1000 tries with backoff would take minutes
		t.Fatalf("retry outlived its context: %v", d)
	}
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep outlived its context")
	}
}

// TestReplay: the pending writes go out through put and del until one fails;
// what went through is confirmed by the store's own calls, the rest stays
// pending for the next round.
func TestReplay(t *testing.T) {
	o := NewOwned()
	o.Put("a", []byte("1"))
	o.Put("b", []byte("2"))
	o.Delete("c")
	fail := errors.New("store away")
	var calls int
	put := func(_ context.Context, k string, v []byte) error {
		calls++
		if calls > 1 {
			return fail
		}
		o.Confirm(k, v)
		return nil
	}
	del := func(_ context.Context, k string) error {
		calls++
		if calls > 1 {
			return fail
		}
		o.Confirm(k, nil)
		return nil
	}
	if err := o.Replay(context.Background(), time.Second, put, del); err != fail || calls != 2 {
		t.Fatalf("replay = %v after %d calls, want the failure after 2", err, calls)
	}
	if n := len(o.Pending()); n != 2 {
		t.Fatalf("%d pending after one write went through, want 2", n)
	}
	calls = -10 // every call succeeds now
	if err := o.Replay(context.Background(), time.Second, put, del); err != nil || len(o.Pending()) != 0 {
		t.Fatalf("second replay: %v, %d pending", err, len(o.Pending()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.Put("d", []byte("4"))
	if err := o.Replay(ctx, time.Second, put, del); err != context.Canceled {
		t.Fatalf("replay with an ended context = %v", err)
	}
}
