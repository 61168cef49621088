package authsecret

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/tecache/te/internal/errs"
)

// Environment variables, read when no value or file is given.
const (
	EnvSecret     = "TE_AUTH_SECRET"
	EnvSecretFile = "TE_AUTH_SECRET_FILE"
)

// MinLen is the shortest secret accepted: 16 bytes, so that a guessable
// word is refused at start instead of protecting nothing.
const MinLen = 16

// maxFile bounds a secret file.
const maxFile = 64 << 10

// TokenMessage is the message HMAC'ed with the secret into the sidecar
// token.
const TokenMessage = "te-sidecar-token v1"

// Secrets is a cluster secret and, during a rotation, the previous one.
type Secrets struct {
	Current  []byte
	Previous []byte // nil outside a rotation
}

// Parse reads a secret in its text form: the current secret on the first
// non-empty line, optionally the previous one on a second. Lines are trimmed
// of surrounding white space; each must be at least MinLen bytes. The same
// secret twice is one secret.
func Parse(text string) (*Secrets, error) {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	switch {
	case len(lines) == 0:
		return nil, errs.New(errs.InvalidArgument, "secret", "no secret in the text given")
	case len(lines) > 2:
		return nil, errs.New(errs.InvalidArgument, "secret", "%d lines: want the secret and at most one previous secret", len(lines))
	}
	var s Secrets
	for i, l := range lines {
		what := "the secret"
		if i == 1 {
			what = "the previous secret (second line)"
		}
		if len(l) < MinLen {
			return nil, errs.New(errs.InvalidArgument, "secret", "%s is %d bytes; at least %d are needed", what, len(l), MinLen).
				WithHint("generate one with: head -c 32 /dev/urandom | base64")
		}
		if i == 0 {
			s.Current = []byte(l)
		} else if l != lines[0] {
			s.Previous = []byte(l)
		}
	}
	return &s, nil
}

// ReadFile reads a secret file (see Parse).
//
// The file must be a regular file (a mounted Kubernetes Secret is one,
// through its symbolic links). It is opened without blocking, so a FIFO, a
// socket or a device named by mistake is refused at once rather than
// holding the caller (engine creation, te-sidecar's start) until something
// writes to it.
func ReadFile(path string) (*Secrets, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "secret", err, "reading the secret file")
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "secret", err, "reading the secret file %s", path)
	}
	if !fi.Mode().IsRegular() {
		return nil, errs.New(errs.InvalidArgument, "secret", "secret file %s is not a regular file (it is a %s): "+
			"put the secret in a file, or pass it in TE_AUTH_SECRET", path, fileKind(fi.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "secret", err, "reading the secret file %s", path)
	}
	if len(b) > maxFile {
		return nil, errs.New(errs.InvalidArgument, "secret", "secret file %s is over %d bytes", path, maxFile)
	}
	s, err := Parse(string(b))
	if err != nil {
		return nil, errs.Wrap(errs.CodeOf(err), "secret", err, "secret file %s", path)
	}
	return s, nil
}

// fileKind names what a non-regular file is, for an error message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "file of mode " + m.Type().String()
}

// Load returns the secret given by value, else by the file at path, else
// by the environment (TE_AUTH_SECRET_FILE, then TE_AUTH_SECRET, through
// getenv; nil getenv reads none). It returns nil, nil when there is none.
func Load(value, path string, getenv func(string) string) (*Secrets, error) {
	s, _, err := LoadFrom(value, path, getenv)
	return s, err
}

// LoadFrom is Load, and says where it found the secret (for a log line,
// never the secret). A file that cannot be read or a malformed secret is an
// error, never a fall-through: a misconfigured secret must not silently turn
// authentication off.
func LoadFrom(value, path string, getenv func(string) string) (*Secrets, string, error) {
	from := func(text, src string) (*Secrets, string, error) {
		s, err := Parse(text)
		if err != nil {
			return nil, "", errs.Wrap(errs.CodeOf(err), "secret", err, "from %s", src)
		}
		return s, src, nil
	}
	file := func(p, src string) (*Secrets, string, error) {
		s, err := ReadFile(p)
		if err != nil {
			return nil, "", errs.Wrap(errs.CodeOf(err), "secret", err, "named by %s", src)
		}
		return s, src, nil
	}
	switch {
	case strings.TrimSpace(value) != "":
		return from(value, "the configuration")
	case path != "":
		return file(path, "file "+path)
	case getenv == nil:
		return nil, "", nil
	}
	if p := getenv(EnvSecretFile); p != "" {
		return file(p, EnvSecretFile+"="+p)
	}
	if v := getenv(EnvSecret); v != "" {
		return from(v, EnvSecret)
	}
	return nil, "", nil
}

// Token returns the sidecar token of one secret.
func Token(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(TokenMessage))
	return hex.EncodeToString(m.Sum(nil))
}

// Token returns the sidecar token of the current secret: the one clients
// send.
func (s *Secrets) Token() string { return Token(s.Current) }

// Tokens returns the tokens the sidecar accepts: the current secret's and,
// during a rotation, the previous one's.
func (s *Secrets) Tokens() []string {
	t := []string{Token(s.Current)}
	if s.Previous != nil {
		t = append(t, Token(s.Previous))
	}
	return t
}

// Match reports whether got equals one of want, comparing with every
// candidate in constant time.
func Match(got string, want []string) bool {
	ok := 0
	for _, w := range want {
		if w != "" {
			ok |= subtle.ConstantTimeCompare([]byte(got), []byte(w))
		}
	}
	return ok == 1
}
