package engine_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tecache/te/engine"
)

// Engines that share the cluster secret talk; one without it, or with
// another, is refused before it learns anything. In a deployment the secret
// comes from TE_AUTH_SECRET_FILE (a mounted file) rather than the Config.
func ExampleConfig_authSecret() {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := func(secret string) engine.Config {
		return engine.Config{ListenAddr: "127.0.0.1:0", AuthSecret: secret, Logger: quiet}
	}
	target, _ := engine.New(cfg("s3cret, at least 16 bytes"))
	defer target.Close()
	peer, _ := engine.New(cfg("s3cret, at least 16 bytes"))
	defer peer.Close()
	stranger, _ := engine.New(cfg("another cluster's secret"))
	defer stranger.Close()

	_, err := peer.Probe(target.Name())
	fmt.Println("same secret:", err)
	_, err = stranger.Probe(target.Name())
	fmt.Println("other secret:", errors.Is(err, engine.ErrUnauthenticated))
	// The target counts the refusal just after it told the stranger.
	for i := 0; i < 1000 && target.Stats().Control.AuthRefused == 0; i++ {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("refused by the target:", target.Stats().Control.AuthRefused)
	// Output:
	// same secret: <nil>
	// other secret: true
	// refused by the target: 1
}

// Limits bound what peers can make an engine hold; zero fields take the
// defaults (internal/wire/spec.md, "Resource bounds").
func ExampleLimits() {
	e, err := engine.New(engine.Config{
		ListenAddr: "127.0.0.1:0",
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Limits: engine.Limits{
			MaxConnsPerHost: 64,       // one address may hold 64 control connections
			NotifyBytes:     16 << 20, // undrained notifications, all senders
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	st := e.Stats().Control
	fmt.Println(st.ConnsOpen, st.RefusedConns, st.RefusedNotifies)
	// Output: 0 0 0
}
