// Package cluster runs a real zygote-on-Kubernetes cluster on loopback for the e2e
// tests and the bench: etcd + kube-apiserver (built from the module proxy by
// scripts/k8s-setup.sh, started through envtest), the CRDs, the controller, and N
// "nodes", each a zygoted process with its own state dir and port plus a zygote-node
// agent. Everything listens on 127.0.0.1 only.
package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
)

// Options of a cluster.
type Options struct {
	// Dir for state dirs, logs and the kubeconfig.
	Dir   string
	Nodes int
	// NodeMemoryMiB and NodeVCPUs each node agent offers.
	NodeMemoryMiB int64
	NodeVCPUs     int
	// LeaseDuration of the nodes, and the controller's grace before Lost.
	LeaseDuration, Grace time.Duration
	// Logf reports progress.
	Logf func(format string, args ...any)
	// Registry: also run an OCI registry on loopback (Debian's docker-registry), for
	// branch points moved between nodes as snapshot packs.
	Registry bool
}

// Bins are the programs a cluster runs.
type Bins struct {
	Assets, Zygoted, Controller, Node string
}

// Root of the k8s module (this file is k8s/test/cluster/cluster.go).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// FindBins locates the programs, or says what is missing (a test then skips).
func FindBins() (Bins, string) {
	var b Bins
	b.Assets = os.Getenv("KUBEBUILDER_ASSETS")
	if b.Assets == "" {
		return b, "KUBEBUILDER_ASSETS is not set (make test-k8s builds kube-apiserver, etcd and kubectl with scripts/k8s-setup.sh)"
	}
	for _, f := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(b.Assets, f)); err != nil {
			return b, "no " + f + " in KUBEBUILDER_ASSETS=" + b.Assets
		}
	}
	repo := filepath.Dir(Root())
	b.Zygoted = envOr("ZYGOTED", filepath.Join(repo, "target/release/zygoted"))
	b.Controller = envOr("ZYGOTE_CONTROLLER", filepath.Join(Root(), "bin/zygote-controller"))
	b.Node = envOr("ZYGOTE_NODE", filepath.Join(Root(), "bin/zygote-node"))
	for _, f := range []string{b.Zygoted, b.Controller, b.Node} {
		if _, err := os.Stat(f); err != nil {
			return b, "missing " + f + " (make test-k8s builds it)"
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return b, "qemu-system-x86_64 is not installed (scripts/setup.sh installs it): the qemu runtime cannot run"
	}
	return b, ""
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Proc is a program the cluster runs, restartable.
type Proc struct {
	Name string
	Args []string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start (again).
func (p *Proc) Start() error {
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "==== %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.Args, " "))
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return nil
}

// Running says whether the process is alive.
func (p *Proc) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid of the running process (0 if none).
func (p *Proc) Pid() int {
	if !p.Running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop with sig, waiting up to 15 s (then SIGKILL).
func (p *Proc) Stop(sig syscall.Signal) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Node is one zygoted plus its node agent.
type Node struct {
	Name, StateDir, URL string
	Daemon, Agent       *Proc
	Client              *daemon.Client
}

// Cluster is the running whole.
type Cluster struct {
	Opts       Options
	Bins       Bins
	Env        *envtest.Environment
	Config     *rest.Config
	Client     client.Client
	Kubeconfig string
	Controller *Proc
	Nodes      []*Node
	// RegistryAddr: host:port of the loopback registry ("" without one), and why not.
	RegistryAddr, NoRegistry string
	registry                 *Proc
}

// Namespace of the node Leases.
const Namespace = "zygote-system"

// Scheme with zygote's kinds.
func Scheme() *kruntime.Scheme {
	s := kruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = zv1.AddToScheme(s)
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start brings the whole cluster up: control plane, CRDs, controller, nodes (each
// waited for until its ZygoteNode is Ready).
func Start(ctx context.Context, bins Bins, o Options) (*Cluster, error) {
	c := &Cluster{Opts: o, Bins: bins}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
		c.Opts.Logf = o.Logf
	}
	t0 := time.Now()
	c.Env = &envtest.Environment{
		BinaryAssetsDirectory:    bins.Assets,
		CRDDirectoryPaths:        []string{filepath.Join(Root(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: 90 * time.Second,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := c.Env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting etcd + kube-apiserver: %w", err)
	}
	c.Config = cfg
	o.Logf("control plane up with CRDs in %.1fs (%s)", time.Since(t0).Seconds(), cfg.Host)
	user, err := c.Env.AddUser(envtest.User{Name: "zygote-e2e", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return c, err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return c, err
	}
	c.Kubeconfig = filepath.Join(o.Dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return c, err
	}
	if c.Client, err = client.New(cfg, client.Options{Scheme: Scheme()}); err != nil {
		return c, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if err := c.Client.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		return c, err
	}
	if o.Registry {
		if err := c.startRegistry(); err != nil {
			c.NoRegistry = err.Error()
			o.Logf("no registry: %v", err)
		}
	}
	c.Controller = &Proc{Name: "controller", Log: filepath.Join(o.Dir, "controller.log"), Args: []string{
		bins.Controller, "--kubeconfig", c.Kubeconfig, "--node-namespace", Namespace,
		"--node-lost-grace", o.Grace.String(), "--node-sweep-interval", "500ms"}}
	if err := c.Controller.Start(); err != nil {
		return c, err
	}
	for i := 0; i < o.Nodes; i++ {
		n, err := c.startNode(ctx, fmt.Sprintf("node-%c", 'a'+i))
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err := c.WaitNodeReady(ctx, n.Name, 90*time.Second); err != nil {
			return c, err
		}
	}
	o.Logf("cluster of %d nodes ready in %.1fs", o.Nodes, time.Since(t0).Seconds())
	return c, nil
}

func (c *Cluster) startNode(ctx context.Context, name string) (*Node, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	n := &Node{Name: name, StateDir: filepath.Join(c.Opts.Dir, name), URL: fmt.Sprintf("http://127.0.0.1:%d", port)}
	if err := os.MkdirAll(n.StateDir, 0o700); err != nil {
		return nil, err
	}
	n.Daemon = &Proc{Name: name + "/zygoted", Log: filepath.Join(c.Opts.Dir, name+"-zygoted.log"), Args: []string{
		c.Bins.Zygoted, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--state-dir", n.StateDir,
		"--runtime", "qemu", "--proxy-listen", "none"}}
	if err := n.Daemon.Start(); err != nil {
		return nil, err
	}
	if err := c.WaitDaemon(ctx, n, 60*time.Second); err != nil {
		return nil, err
	}
	n.Agent = &Proc{Name: name + "/agent", Log: filepath.Join(c.Opts.Dir, name+"-agent.log"), Args: []string{
		c.Bins.Node, "--kubeconfig", c.Kubeconfig, "--node-name", name, "--daemon-url", n.URL,
		"--daemon-state-dir", n.StateDir, "--namespace", Namespace,
		"--lease-duration", c.Opts.LeaseDuration.String(), "--memory-mib", strconv.FormatInt(c.Opts.NodeMemoryMiB, 10),
		"--vcpus", strconv.Itoa(c.Opts.NodeVCPUs), "--status-interval", "1s", "--gc-interval", "3s",
		"--resync", "5s"}}
	return n, n.Agent.Start()
}

func (c *Cluster) startRegistry() error {
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return fmt.Errorf("docker-registry is not installed (scripts/setup.sh installs it)")
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.Opts.Dir, "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	config := filepath.Join(dir, "config.yml")
	yaml := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n"+
		"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%d\n  secret: zygote-k8s-test\n", filepath.Join(dir, "storage"), port)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		return err
	}
	c.registry = &Proc{Name: "registry", Log: filepath.Join(c.Opts.Dir, "registry.log"), Args: []string{bin, "serve", config}}
	if err := c.registry.Start(); err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i := 0; i < 100; i++ {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			c.RegistryAddr = addr
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("docker-registry did not listen on %s (log %s)", addr, c.registry.Log)
}

// WaitDaemon waits for a node's daemon to answer (and reads its token).
func (c *Cluster) WaitDaemon(ctx context.Context, n *Node, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tok, err := daemon.TokenFromStateDir(n.StateDir)
		if err == nil {
			n.Client = daemon.New(n.URL, tok)
			if err = n.Client.Healthz(ctx); err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: zygoted did not answer in %s: %v (log %s)", n.Name, timeout, err, n.Daemon.Log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitNodeReady waits until the controller judges the node Ready.
func (c *Cluster) WaitNodeReady(ctx context.Context, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var n zv1.ZygoteNode
		err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &n)
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == zv1.ConditionReady && cond.Status == metav1.ConditionTrue && n.Status.Capacity != nil {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s not Ready after %s (get: %v; status %+v)", name, timeout, err, n.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Node by name.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// KillHost simulates a host dying: SIGKILL to its daemon and to every VM process of
// its state dir (the VMs would otherwise outlive the daemon, as designed).
func (c *Cluster) KillHost(n *Node) int {
	n.Daemon.Stop(syscall.SIGKILL)
	return KillVMProcesses(n.StateDir)
}

// KillVMProcesses SIGKILLs every process whose working directory is under dir (each
// VM's supervisor shell and QEMU run in the VM's directory) and says how many.
func KillVMProcesses(dir string) int {
	return len(VMProcesses(dir, true))
}

// VMProcesses lists (and with kill, SIGKILLs) the processes whose cwd is under dir.
func VMProcesses(dir string, kill bool) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		pids = append(pids, pid)
		if kill {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return pids
}

// Stop tears everything down: Sandboxes' VMs through each daemon, the programs, the
// control plane; then kills any VM process left under the state dirs.
func (c *Cluster) Stop(ctx context.Context) {
	for _, n := range c.Nodes {
		if n.Agent != nil {
			n.Agent.Stop(syscall.SIGTERM)
		}
	}
	if c.Controller != nil {
		c.Controller.Stop(syscall.SIGTERM)
	}
	for _, n := range c.Nodes {
		if n.Client != nil && n.Daemon.Running() {
			if vms, err := n.Client.List(ctx, nil); err == nil {
				for _, vm := range vms {
					_ = n.Client.Delete(ctx, vm.ID)
				}
			}
		}
		n.Daemon.Stop(syscall.SIGTERM)
		KillVMProcesses(n.StateDir)
	}
	if c.registry != nil {
		c.registry.Stop(syscall.SIGTERM)
	}
	if c.Env != nil {
		_ = c.Env.Stop()
	}
}
