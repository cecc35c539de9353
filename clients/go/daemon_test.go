package inboxd

// Real daemons for the tests: `inboxd serve` on a temp data dir and
// loopback ports, with a client and an admin token file, stopped (or
// SIGKILLed) when the test ends. The binary is $INBOXD_BIN, else the one
// cargo built under target/ at the repository's root; a test fails,
// never skips, when there is none.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	testToken      = "go-test-token"
	testAdminToken = "go-test-admin-token"
	// testTimeout bounds every test's requests.
	testTimeout = 60 * time.Second
)

func inboxdBinary(t testing.TB) string {
	bin, err := findInboxd()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func findInboxd() (string, error) {
	if bin := os.Getenv("INBOXD_BIN"); bin != "" {
		return bin, nil
	}
	for _, profile := range []string{"debug", "release"} {
		bin := filepath.Join("..", "..", "target", profile, "inboxd")
		if _, err := os.Stat(bin); err == nil {
			return filepath.Abs(bin)
		}
	}
	return "", errors.New("no inboxd binary: set INBOXD_BIN or build it with `cargo build -p inbox-server --bin inboxd`")
}

type daemon struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

// startDaemon starts inboxd with extra flags (a --listen among them
// replaces the default 127.0.0.1:0) on dataDir, waits until it listens,
// and stops it when the test ends. Its log is shown if the test fails.
func startDaemon(t testing.TB, dataDir string, extra ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	d, err := spawnDaemon(inboxdBinary(t), dataDir, dir, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "inboxd.log")); err == nil && len(b) > 0 {
				t.Logf("inboxd on %s logged:\n%s", dataDir, b)
			}
		}
	})
	return d
}

// spawnDaemon starts inboxd with its token files and log in dir.
func spawnDaemon(bin, dataDir, dir string, extra ...string) (*daemon, error) {
	tokens := map[string]string{"token": testToken + "\n", "admin_token": testAdminToken + "\n"}
	for name, text := range tokens {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	args := []string{"serve", "--data-dir", dataDir, "--metrics-listen", "127.0.0.1:0",
		"--token-file", filepath.Join(dir, "token"), "--admin-token-file", filepath.Join(dir, "admin_token")}
	if !contains(extra, "--listen") {
		args = append(args, "--listen", "127.0.0.1:0")
	}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), "INBOXD_LOG=warn")
	logFile, err := os.Create(filepath.Join(dir, "inboxd.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	d := &daemon{cmd: cmd, dir: dataDir}
	line, _ := bufio.NewReader(out).ReadString('\n')
	// "listening on ADDR metrics on ADDR"
	words := strings.Fields(line)
	if len(words) != 6 || words[0] != "listening" {
		d.kill()
		return nil, fmt.Errorf("inboxd did not start: %q", line)
	}
	d.addr = words[2]
	return d, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// stop ends the daemon with SIGTERM, or SIGKILL after 20 s.
func (d *daemon) stop() {
	if d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

// kill is SIGKILL.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}

func newDaemon(t testing.TB, extra ...string) *daemon {
	return startDaemon(t, filepath.Join(t.TempDir(), "data"), extra...)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func dial(t testing.TB, addr, token string) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), addr, Options{Token: []byte(token), ClientName: "go-test"})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// freePorts are loopback ports nothing listened on a moment ago, below
// the kernel's ephemeral range, so that no socket bound to port 0 takes
// one before the member that is given it binds it.
func freePorts(t testing.TB, n int) []int {
	freePortsMu.Lock()
	defer freePortsMu.Unlock()
	below := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &below)
	}
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 10000 {
			t.Fatalf("no %d free ports below %d", n, below)
		}
		port := 10000 + rand.Intn(below-10000)
		if freePortsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		freePortsGiven[port] = true
		out = append(out, port)
	}
	return out
}

var (
	freePortsMu    sync.Mutex
	freePortsGiven = map[int]bool{}
)

// group is a replicated group of `size` members on loopback.
type group struct {
	members []*daemon
	clients []string
}

func startGroup(t testing.TB, size int) *group {
	ports := freePorts(t, 2*size)
	g := &group{}
	var peers, rafts []string
	for i := 0; i < size; i++ {
		client := fmt.Sprintf("127.0.0.1:%d", ports[i])
		raft := fmt.Sprintf("127.0.0.1:%d", ports[size+i])
		g.clients, rafts = append(g.clients, client), append(rafts, raft)
		peers = append(peers, fmt.Sprintf("%d=%s/%s", i+1, raft, client))
	}
	for i := 0; i < size; i++ {
		g.members = append(g.members, newDaemon(t, "--node-id", fmt.Sprint(i+1), "--raft-listen", rafts[i],
			"--peers", strings.Join(peers, ","), "--listen", g.clients[i]))
	}
	return g
}

// leader waits until a live member says it leads, and returns its index.
func (g *group) leader(t testing.TB, ctx context.Context) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for i, d := range g.members {
			if d.cmd.ProcessState != nil {
				continue
			}
			c, err := Dial(ctx, g.clients[i], Options{Token: []byte(testAdminToken)})
			if err != nil {
				continue
			}
			st, err := c.ClusterStatus(ctx)
			c.Close()
			if err == nil && st.Role == "leader" {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no leader within 30 s")
	return -1
}
