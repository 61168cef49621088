// Package lab builds a small cluster of hosts on one machine from Linux
// network namespaces, so that cross-process tests of te cross a real
// (virtual) network instead of one loopback: every host is a namespace with
// its own addresses and one veth "NIC" per rail, every rail is a Linux
// bridge in a "switch" namespace, and the root namespace is left untouched.
//
// Addresses come only from 198.18.0.0/15 (RFC 2544's benchmarking range):
// host i has 198.18.<rail>.<i+1>/24 on rail r, and no route leads anywhere
// else, so nothing leaves the machine. Names carry a random suffix, so runs
// side by side do not collide, and t.Cleanup deletes every namespace (and
// with it every veth and bridge) and kills every process the lab started,
// whether the test passed or not.
//
// Faults: LinkDown/LinkUp take one host's port on one rail down at the
// switch (a pulled cable: the host's packets vanish, nothing reports an
// error); Partition cuts every host of one set off from every host of the
// other by pointing their neighbour entries for each other at a MAC address
// nobody has (silent drops at layer 2, other hosts unaffected; the kernel
// here has neither netfilter nor tc actions); Heal undoes both. A Proc started in a host can be frozen
// (SIGSTOP), thawed and killed. Options.RateMbit shapes every link with a
// tbf qdisc, both directions.
//
// Building a lab needs root and `ip netns`; where either is missing New
// skips the test with one line, except in CI (CI=true) as root, where it
// fails: CI must run these tests.
package lab
