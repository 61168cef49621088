package tebench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
)

const usage = `usage:
  te-bench -version                       (prints te's version, engine.Version)
  te-bench target    [--listen host:port] [--buffer SIZE] [--metadata URL] [--accept-mooncake]
                     [--cpuprofile FILE]
  te-bench initiator --segment NAME [--ref host:port] [run flags]
      (NAME may be a Mooncake Transfer Engine's segment: te speaks its
      handshake and tcp framing; --accept-mooncake serves Mooncake initiators)
  te-bench loopback  [run flags] [--file PATH]   (starts its own target process;
      with --file the target also registers the file and every run goes to
      its memory and then to the file, over the same transport)
  te-bench target ... --file PATH        (serve a file too: remote file target)
  te-bench file --path PATH [--size SIZE] [--op read,write] [--block 4KiB,1MiB]
      [--depth 32] [--pattern seq,rand] [--direct on,off] [--fio] [--pool] [--fixed]
      [--duration D] [--json]    (a local file through the engine; --fio runs
      fio on the same file with the same workload and reports the ratio)

run flags (op, block, batch and threads take comma-separated lists; every
combination is run):
  --op read|write        --block SIZE (4096, 64KiB, 1MiB)   --batch N
  --threads N            --duration D (Go duration or seconds)
  --transport tcp|shm|cxl|local|rdma|auto --conns N (tcp.conns)  --slice SIZE (tcp.slice)
  --json                 --cpuprofile FILE                   --metadata URL
  --secret off|on|enc|off,on,enc (loopback: run without a cluster secret, with
           one (integrity sessions), and/or with one and encryption)
Mooncake's transfer_engine_bench names are accepted too: --operation,
--block_size, --batch_size, --segment_id, --protocol, --metadata_server.

Log lines go to stderr in te's style: TE_LOG_LEVEL (debug, info, warn,
error, off; default info) and TE_LOG_FORMAT (text or json).
`

// Main runs te-bench with args (without the program name) and returns the
// exit status. exe is the te-bench executable loopback starts as its target.
func Main(ctx context.Context, exe string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, "te-bench", engine.Version)
		return 0
	case "target":
		err = mainTarget(ctx, args[1:], stdin, stdout, stderr)
	case "initiator":
		err = mainRun(ctx, "", args[1:], stdout, stderr, false)
	case "loopback":
		err = mainRun(ctx, exe, args[1:], stdout, stderr, true)
	case "file":
		err = mainFile(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "te-bench: unknown mode %q\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "te-bench:", err)
		if errs.CodeOf(err) == errs.InvalidArgument {
			return 2
		}
		return 1
	}
	return 0
}

type sizeFlag struct{ v *uint64 }

func (s sizeFlag) String() string {
	if s.v == nil {
		return ""
	}
	return FormatSize(*s.v)
}
func (s sizeFlag) Set(x string) error {
	n, err := transport.ParseSize(x)
	if err != nil {
		return err
	}
	*s.v = n
	return nil
}

type durFlag struct{ v *time.Duration }

func (d durFlag) String() string {
	if d.v == nil {
		return ""
	}
	return d.v.String()
}
func (d durFlag) Set(x string) error {
	if n, err := strconv.Atoi(x); err == nil { // Mooncake's --duration is seconds
		*d.v = time.Duration(n) * time.Second
		return nil
	}
	v, err := time.ParseDuration(x)
	if err != nil {
		return err
	}
	*d.v = v
	return nil
}

func mainTarget(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("te-bench target", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := TargetOptions{Buffer: 256 << 20}
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:0", "RPC listener host:port (the segment name in P2PHANDSHAKE mode)")
	fs.StringVar(&o.Metadata, "metadata", "", "metadata connection string (default P2PHANDSHAKE)")
	fs.StringVar(&o.Metadata, "metadata_server", "", "alias of --metadata")
	fs.Var(sizeFlag{&o.Buffer}, "buffer", "registered buffer size")
	fs.BoolVar(&o.AcceptMooncake, "accept-mooncake", false, "serve Mooncake Transfer Engine initiators (Config.AcceptMooncakePeers)")
	fs.StringVar(&o.File, "file", "", "also register this file (created, --buffer bytes) as a storage buffer")
	fs.BoolVar(&o.FileNoDirect, "file-no-direct", false, "keep the file's I/O in the page cache")
	stdinExit := fs.Bool("exit-on-stdin-eof", false, "stop when stdin closes (used by loopback)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the target, from start to exit, to this file")
	if err := fs.Parse(args); err != nil {
		return errs.Wrap(errs.InvalidArgument, "te-bench", err, "flags")
	}
	if *cpuprofile != "" {
		pf, err := os.Create(*cpuprofile)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, "te-bench", err, "cpuprofile")
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return errs.Wrap(errs.Internal, "te-bench", err, "cpuprofile")
		}
		defer pprof.StopCPUProfile()
	}
	t, err := StartTarget(o)
	if err != nil {
		return err
	}
	defer t.Close()
	b, _ := json.Marshal(t.Info)
	fmt.Fprintln(stdout, string(b))
	fmt.Fprintf(stderr, "te-bench target: segment %s, %s at %#x, raw tcp reference at %s\n",
		t.Info.Segment, FormatSize(t.Info.Length), t.Info.Addr, t.Info.Ref)
	if *stdinExit {
		eof := make(chan struct{})
		go func() { io.Copy(io.Discard, stdin); close(eof) }()
		select {
		case <-eof:
		case <-ctx.Done():
		}
		return nil
	}
	<-ctx.Done()
	return nil
}

type runFlags struct {
	segment, ref, metadata, transport string
	ops, blocks, batches, threads     string
	duration                          time.Duration
	conns                             int
	provider                          string // fabric.provider
	slice                             uint64
	json                              bool
	cpuprofile                        string
	buffer                            uint64
	secret                            string
	file                              string
	fileNoDirect                      bool
}

func list(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func mainRun(ctx context.Context, exe string, args []string, stdout, stderr io.Writer, loopback bool) error {
	fs := flag.NewFlagSet("te-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := runFlags{duration: 5 * time.Second}
	for _, n := range []string{"segment", "segment_id"} {
		fs.StringVar(&f.segment, n, "", "target segment name")
	}
	fs.StringVar(&f.ref, "ref", "", "raw TCP reference server of the target (printed by te-bench target)")
	for _, n := range []string{"metadata", "metadata_server"} {
		fs.StringVar(&f.metadata, n, "", "metadata connection string (default P2PHANDSHAKE)")
	}
	for _, n := range []string{"transport", "protocol"} {
		fs.StringVar(&f.transport, n, "tcp", "tcp, shm, local, rdma, fabric or auto")
	}
	for _, n := range []string{"op", "operation"} {
		fs.StringVar(&f.ops, n, "read", "read, write or a list")
	}
	for _, n := range []string{"block", "block_size"} {
		fs.StringVar(&f.blocks, n, "64KiB", "request size or a list")
	}
	for _, n := range []string{"batch", "batch_size"} {
		fs.StringVar(&f.batches, n, "128", "requests per batch or a list")
	}
	fs.StringVar(&f.threads, "threads", "1", "initiator threads or a list")
	fs.Var(durFlag{&f.duration}, "duration", "measured time per run")
	fs.IntVar(&f.conns, "conns", 0, "tcp connections per peer (tcp.conns; default from the core count)")
	fs.StringVar(&f.provider, "provider", "", "libfabric provider of the fabric transport (fabric.provider: efa, cxi, tcp, shm, sockets; default efa, then cxi), on both sides")
	fs.Var(sizeFlag{&f.slice}, "slice", "tcp slice size (tcp.slice; default from the L2 cache)")
	fs.BoolVar(&f.json, "json", false, "print one JSON object per run")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of the initiator to this file")
	fs.Var(sizeFlag{&f.buffer}, "buffer", "loopback: the target's buffer size (default 256MiB)")
	fs.StringVar(&f.secret, "secret", "", "loopback: off, on (a random cluster secret on both sides: integrity sessions), enc (and encryption) or a list such as off,on,enc (each run every way, one after the other); default: the environment's")
	fs.StringVar(&f.file, "file", "", "loopback: the target also registers this file (--buffer bytes); every run then goes to its memory and to the file")
	fs.BoolVar(&f.fileNoDirect, "file-no-direct", false, "loopback: keep the target file's I/O in the page cache")
	if err := fs.Parse(args); err != nil {
		return errs.Wrap(errs.InvalidArgument, "te-bench", err, "flags")
	}
	params := map[string]string{}
	if f.conns != 0 {
		params["tcp.conns"] = strconv.Itoa(f.conns)
	}
	if f.slice != 0 {
		params["tcp.slice"] = strconv.FormatUint(f.slice, 10)
	}
	if f.provider != "" {
		params["fabric.provider"] = f.provider
		// The loopback target (a child process) takes it from its
		// environment.
		os.Setenv("TE_PARAM_fabric_provider", f.provider)
	}
	var runs []Options
	for _, op := range list(f.ops) {
		for _, bs := range list(f.blocks) {
			block, err := transport.ParseSize(bs)
			if err != nil {
				return err
			}
			for _, ba := range list(f.batches) {
				batch, err := strconv.Atoi(ba)
				if err != nil {
					return errs.New(errs.InvalidArgument, "te-bench", "--batch %q", ba)
				}
				for _, th := range list(f.threads) {
					threads, err := strconv.Atoi(th)
					if err != nil {
						return errs.New(errs.InvalidArgument, "te-bench", "--threads %q", th)
					}
					o := Options{Transport: f.transport, Op: op, Block: block, Batch: batch, Threads: threads, Duration: f.duration}
					if err := o.check(); err != nil {
						return err
					}
					runs = append(runs, o)
				}
			}
		}
	}
	if len(runs) == 0 {
		return errs.New(errs.InvalidArgument, "te-bench", "nothing to run")
	}

	// One target and one initiator per secret setting; each run goes to
	// every setting in turn, so the two are measured side by side.
	type side struct {
		secret, enc  bool
		in           *Initiator
		segment, ref string
	}
	settings := []string{""}
	if f.secret != "" {
		if !loopback {
			return errs.New(errs.InvalidArgument, "te-bench", "--secret is for loopback runs; give a target its secret with TE_AUTH_SECRET_FILE")
		}
		settings = list(f.secret)
		// The secret is the flag's business now, not the environment's.
		os.Unsetenv(authsecret.EnvSecret)
		os.Unsetenv(authsecret.EnvSecretFile)
	}
	var sides []side
	var aesGBps float64
	for _, st := range settings {
		secret, enc := "", false
		switch st {
		case "", "off":
		case "on", "enc":
			var b [24]byte
			rand.Read(b[:])
			secret = hex.EncodeToString(b[:])
			enc = st == "enc"
			if enc && aesGBps == 0 {
				aesGBps = RefAESGCM()
			}
		default:
			return errs.New(errs.InvalidArgument, "te-bench", "--secret %q: want off, on, enc or a list of them", st)
		}
		segment, ref := f.segment, f.ref
		switch {
		case loopback && f.transport == "local":
			// Same process: the target is an engine of this one.
			t, err := StartTarget(TargetOptions{Metadata: f.metadata, Buffer: f.buffer, Params: params, Secret: secret,
				File: f.file, FileNoDirect: f.fileNoDirect})
			if err != nil {
				return err
			}
			defer t.Close()
			segment, ref = t.Info.Segment, t.Info.Ref
		case loopback:
			child, info, err := startChild(exe, f, secret, stderr)
			if err != nil {
				return err
			}
			defer child.stop()
			segment, ref = info.Segment, info.Ref
		case segment == "":
			return errs.New(errs.InvalidArgument, "te-bench", "initiator needs --segment")
		}
		// Encryption asked for by the initiator alone: either side asking
		// is enough.
		in, err := newInitiator(segment, f.metadata, f.transport, params, secret, enc)
		if err != nil {
			return err
		}
		defer in.Close()
		sides = append(sides, side{secret: secret != "", enc: enc, in: in, segment: segment, ref: ref})
	}
	in, segment := sides[0].in, sides[0].segment

	if f.cpuprofile != "" {
		pf, err := os.Create(f.cpuprofile)
		if err != nil {
			return errs.Wrap(errs.InvalidArgument, "te-bench", err, "cpuprofile")
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return errs.Wrap(errs.Internal, "te-bench", err, "cpuprofile")
		}
		defer pprof.StopCPUProfile()
	}
	if !f.json {
		fmt.Fprintf(stdout, "machine: %s\n", ThisMachine())
		fmt.Fprintf(stdout, "target: %s (%s engine), tcp.conns %d, tcp.slice %s\n", segment, in.peer, in.conns, FormatSize(in.slice))
	}
	for _, o := range runs {
		for _, sd := range sides {
			o.Segment, o.Ref, o.Metadata, o.Params = sd.segment, sd.ref, f.metadata, params
			// A target with a file: the memory run, then the file run
			// with its ratio to the memory one.
			targets := []bool{false}
			if sd.in.flen > 0 {
				targets = append(targets, true)
			}
			var memGBps float64
			for _, file := range targets {
				o.File = file
				r, err := sd.in.Run(ctx, o)
				if err != nil {
					return err
				}
				r.Secret, r.Encrypt = sd.secret, sd.enc
				if sd.enc {
					r.RefAESGCMGBps = aesGBps
				}
				if !file {
					memGBps = r.GBps
				} else if memGBps > 0 {
					r.RatioMemory = r.GBps / memGBps
				}
				if f.json {
					fmt.Fprintln(stdout, r.JSON())
				} else {
					fmt.Fprintln(stdout, r)
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	return nil
}

type childProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{}
}

// startChild starts `exe target` on loopback and reads its announcement;
// secret, if any, goes to it in TE_AUTH_SECRET.
func startChild(exe string, f runFlags, secret string, stderr io.Writer) (*childProc, TargetInfo, error) {
	args := []string{"target", "--listen", "127.0.0.1:0", "--exit-on-stdin-eof"}
	if f.buffer != 0 {
		args = append(args, "--buffer", strconv.FormatUint(f.buffer, 10))
	}
	if f.metadata != "" {
		args = append(args, "--metadata", f.metadata)
	}
	if f.file != "" {
		args = append(args, "--file", f.file)
		if f.fileNoDirect {
			args = append(args, "--file-no-direct")
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = stderr
	if secret != "" {
		cmd.Env = append(os.Environ(), authsecret.EnvSecret+"="+secret)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, TargetInfo{}, errs.Wrap(errs.Internal, "te-bench", err, "stdin pipe")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, TargetInfo{}, errs.Wrap(errs.Internal, "te-bench", err, "stdout pipe")
	}
	if err := cmd.Start(); err != nil {
		return nil, TargetInfo{}, errs.Wrap(errs.Internal, "te-bench", err, "start target %s", exe)
	}
	c := &childProc{cmd: cmd, in: in, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		lines <- s
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(c.done)
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(30 * time.Second):
		c.stop()
		return nil, TargetInfo{}, errs.New(errs.Timeout, "te-bench", "target process did not announce itself")
	}
	var info TargetInfo
	if err := json.Unmarshal([]byte(line), &info); err != nil || info.Segment == "" {
		c.stop()
		return nil, TargetInfo{}, errs.New(errs.Internal, "te-bench", "target process said %q", strings.TrimSpace(line))
	}
	return c, info, nil
}

// stop closes the child's stdin (it exits cleanly) and kills it if it lingers.
func (c *childProc) stop() {
	c.in.Close()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
}
