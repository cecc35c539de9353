package inboxd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writePKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate signed by it, as PEM files in dir.
func writePKI(t *testing.T, dir string) {
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, kind string, der []byte) {
		b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	caKey := key()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "inboxd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca.pem", "CERTIFICATE", caDER)
	for i, leaf := range []struct {
		name  string
		usage x509.ExtKeyUsage
	}{{"server", x509.ExtKeyUsageServerAuth}, {"client", x509.ExtKeyUsageClientAuth}} {
		k := key()
		cert := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: leaf.name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{leaf.usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, cert, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		write(leaf.name+".pem", "CERTIFICATE", der)
		write(leaf.name+".key", "PRIVATE KEY", keyDER)
	}
}

func TestMutualTLSNeedsTheClientCertificateAndPlainTCPIsNotServed(t *testing.T) {
	pki := t.TempDir()
	writePKI(t, pki)
	at := func(name string) string { return filepath.Join(pki, name) }
	d := newDaemon(t, "--tls-cert", at("server.pem"), "--tls-key", at("server.key"), "--tls-client-ca", at("ca.pem"))
	ctx := testCtx(t)

	withCert, err := TLSConfig(at("ca.pem"), at("client.pem"), at("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, d.addr, Options{Token: []byte(testToken), TLS: withCert})
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer c.Close()
	need(c.Join(ctx, 1, 1))
	if r := need(c.Send(ctx, SendRequest{Conv: 1, Sender: 1, Payload: []byte("over TLS")})); r.MsgSeq != 2 {
		t.Fatalf("send %+v", r)
	}

	withoutCert, err := TLSConfig(at("ca.pem"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := Dial(ctx, d.addr, Options{Token: []byte(testToken), TLS: withoutCert}); err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		err = c.Ping(ctx)
		c.Close()
		if err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
	if c, err := Dial(ctx, d.addr, Options{Token: []byte(testToken), DialTimeout: 3 * time.Second}); err == nil {
		c.Close()
		t.Fatal("plain TCP was served on a TLS listener")
	}
	if _, err := TLSConfig(at("server.key"), "", ""); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
}
