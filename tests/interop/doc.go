// Package interop tests te against other engines' real binaries.
//
// The Mooncake tests run Mooncake Transfer Engine programs (mc_peer,
// Mooncake's HTTP metadata server) from ../shared/interop/mooncake beside
// the repository, or from $TE_MOONCAKE_INTEROP_DIR. Without that directory
// (a plain clone) they skip and say why; with it, any interop failure fails
// them. The programs need Mooncake's Debian runtime packages
// (.ci/deps.d/interop.pkgs).
package interop
