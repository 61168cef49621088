package engine

// Version is te's version, the same string in every artefact of one build:
// libte's te_version(), te.__version__, te-bench -version, te-sidecar
// -version. It is te.h's ABI version as MAJOR.MINOR.0, followed, unless the
// build is of a commit tagged vMAJOR.MINOR.0, by "+g" and the commit
// ("+g1a2b3c4d5e6f", ".dirty" when the tree had changes): a PEP 440 version
// the Python wheel carries too. mk/version.sh computes it; the Makefile,
// CMakeLists.txt and the pip build backend set it with
// -ldflags "-X github.com/tecache/te/engine.Version=...". A build that does
// not (go build, go install) says "+dev".
var Version = "1.4.0+dev"
