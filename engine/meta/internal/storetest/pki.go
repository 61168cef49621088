package storetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a certificate authority made for one test, with a server
// certificate for 127.0.0.1 and localhost, a client certificate it signed,
// and a client certificate from another authority. The files are PEM in a
// temporary directory.
type PKI struct {
	CA                    string // the CA's certificate
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	RogueCert, RogueKey   string // signed by an authority the servers do not trust
	caCert                *x509.Certificate
	caKey, rogueCAKey     *ecdsa.PrivateKey
	rogueCA               *x509.Certificate
	dir                   string
	serial                int64
}

// NewPKI creates the authority and the certificates.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{dir: t.TempDir()}
	p.caCert, p.caKey = p.authority(t, "te test CA")
	p.rogueCA, p.rogueCAKey = p.authority(t, "rogue CA")
	p.CA = p.write(t, "ca.pem", "CERTIFICATE", p.caCert.Raw)
	p.ServerCert, p.ServerKey = p.leaf(t, "server", p.caCert, p.caKey, x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = p.leaf(t, "client", p.caCert, p.caKey, x509.ExtKeyUsageClientAuth)
	p.RogueCert, p.RogueKey = p.leaf(t, "rogue", p.rogueCA, p.rogueCAKey, x509.ExtKeyUsageClientAuth)
	return p
}

// ClientTLS returns a TLS configuration that trusts the CA and presents the
// client certificate.
func (p *PKI) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.caCert)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}
}

func (p *PKI) key(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *PKI) template(cn string) *x509.Certificate {
	p.serial++
	return &x509.Certificate{
		SerialNumber: big.NewInt(p.serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

func (p *PKI) authority(t testing.TB, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	k := p.key(t)
	tpl := p.template(cn)
	tpl.IsCA, tpl.BasicConstraintsValid = true, true
	tpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func (p *PKI) leaf(t testing.TB, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage) (string, string) {
	k := p.key(t)
	tpl := p.template("te-" + name)
	tpl.KeyUsage = x509.KeyUsageDigitalSignature
	// etcd checks client certificates for client use and server ones for
	// server use; both kinds carry both, as etcd's own guides make them.
	tpl.ExtKeyUsage = []x509.ExtKeyUsage{usage, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	tpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	tpl.DNSNames = []string{"localhost"}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kb)
}

func (p *PKI) write(t testing.TB, name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
