package httpmeta

import (
	"net/http"
	"strings"

	"github.com/tecache/te/internal/authsecret"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sidecarproof"
)

// dialProven makes every connection of tr prove, before the transport
// sends anything on it, that its server holds the cluster secret
// (package sidecarproof): the token derived from the secret then travels
// only over connections to such a server, and a reconnection is proven
// again. path is the metadata path; the proof route is below it.
func (s *Store) dialProven(tr *http.Transport, scheme, path string) {
	s.proof = &sidecarproof.Prover{
		Secrets: s.sec,
		Path:    strings.TrimSuffix(path, "/") + authsecret.ProofPath,
		Timeout: s.timeout,
		Op:      "http metadata",
		Server:  "metadata server " + s.base,
		Hint: "point the store at te-sidecar with the same cluster secret, or set " + EnvToken +
			" to the metadata server's own token (sent without a proof)",
		FailCode: errs.Metadata,
		FailHint: "check that the metadata server is running and reachable",
	}
	s.proof.Install(tr, scheme)
}
