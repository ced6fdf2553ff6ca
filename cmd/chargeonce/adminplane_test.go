package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestWeakAdminKeysRefused: an admin key under 128 bits is refused at
// start, naming the flag, the admin and the way out; `chargeonce admin-key
// new` makes a key and a line serve starts with, and the key works.
func TestWeakAdminKeysRefused(t *testing.T) {
	t.Parallel()
	weak := filepath.Join(t.TempDir(), "admins")
	if err := os.WriteFile(weak, []byte("alice:x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Main(context.Background(), []string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--admin-keys-file", weak}, &apitest.Buffer{}, &apitest.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--admin-keys-file") || !strings.Contains(err.Error(), "alice") ||
		!strings.Contains(err.Error(), "admin-key new") {
		t.Errorf("a 1-character admin key: %v; want a refusal naming --admin-keys-file, alice and admin-key new", err)
	}

	var out apitest.Buffer
	if err := Main(context.Background(), []string{"admin-key", "new", "--name", "alice"}, &out, &apitest.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var key, line string
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case strings.HasPrefix(l, "ak_"):
			key = l
		case strings.HasPrefix(l, "alice:sha256:"):
			line = l
		}
	}
	if key == "" || line == "" || strings.Contains(line, key) {
		t.Fatalf("admin-key new printed:\n%s", out.String())
	}
	good := filepath.Join(t.TempDir(), "admins")
	if err := os.WriteFile(good, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminAddr := freeAddr(t)
	startServe(t, "127.0.0.1:0", "--admin-addr", adminAddr, "--admin-keys-file", good)
	if r := get(t, "http://"+adminAddr+"/admin/v1/charges", key); r.Status != 200 {
		t.Errorf("the new key: %d %s", r.Status, r.Body)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestAdminOverTLS: with --admin-tls-cert and --admin-tls-key the console
// is HTTPS; a browser's sign-in (Origin https://…) is accepted and its
// session cookie is Secure. Plain HTTP on that port is not served.
func TestAdminOverTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
	adminAddr := freeAddr(t)
	startServe(t, "127.0.0.1:0", "--admin-addr", adminAddr, "--admin-tls-cert", certFile, "--admin-tls-key", keyFile)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+adminAddr+"/admin/login", strings.NewReader(url.Values{"key": {"ak_test_demo"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://"+adminAddr)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 || !resp.Cookies()[0].Secure {
		t.Errorf("sign-in over TLS: %s, cookies %v; want 303 and a Secure cookie", resp.Status, resp.Cookies())
	}
	plain, err := http.Get("http://" + adminAddr + "/admin/login")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Error("plain HTTP served on the TLS admin listener")
		}
	}
	for _, args := range [][]string{{"--admin-tls-cert", certFile}, {"--admin-tls-cert", keyFile, "--admin-tls-key", certFile}, {"--admin-trusted-proxies", "10.0.0.0/99"}} {
		err := Main(context.Background(), append([]string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", "127.0.0.1:0",
			"--admin-addr", "127.0.0.1:0"}, args...), &apitest.Buffer{}, &apitest.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "--admin-") {
			t.Errorf("%v: %v; want a refusal naming the flag", args, err)
		}
	}
}
