// The end-to-end suite: a real etcd + kube-apiserver on loopback, the CRDs, the
// controller and three nodes (zygoted on the qemu runtime + zygote-node each). Run by
// `make test-k8s`; it skips, saying why, when a program it needs is missing.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
	"zygote.dev/k8s/test/cluster"
)

const ns = "default"

type env struct {
	t   *testing.T
	ctx context.Context
	c   *cluster.Cluster
	cl  client.Client
}

// eventually polls fn until it says done, failing with its last message after timeout.
func (e *env) eventually(what string, timeout time.Duration, fn func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, msg := fn()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not after %s: %s", what, timeout, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (e *env) sandbox(name string) (*zv1.Sandbox, error) {
	var sb zv1.Sandbox
	err := e.cl.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: name}, &sb)
	return &sb, err
}

func readyReason(sb *zv1.Sandbox) string {
	if c := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionReady); c != nil {
		return c.Reason + ": " + c.Message
	}
	if c := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionScheduled); c != nil {
		return c.Reason + ": " + c.Message
	}
	return "no conditions"
}

// waitRunning waits for a Sandbox to run and returns it.
func (e *env) waitRunning(name string, timeout time.Duration) *zv1.Sandbox {
	e.t.Helper()
	var sb *zv1.Sandbox
	e.eventually("Sandbox "+name+" Running", timeout, func() (bool, string) {
		var err error
		if sb, err = e.sandbox(name); err != nil {
			return false, err.Error()
		}
		if sb.Status.Phase.Terminal() {
			e.t.Fatalf("Sandbox %s is %s: %s", name, sb.Status.Phase, readyReason(sb))
		}
		return sb.Status.Phase == zv1.PhaseRunning, fmt.Sprintf("phase %q (%s)", sb.Status.Phase, readyReason(sb))
	})
	return sb
}

// labelledVMs lists each node's VMs that belong to Sandboxes.
func (e *env) labelledVMs() map[string][]daemon.Sandbox {
	out := map[string][]daemon.Sandbox{}
	for _, n := range e.c.Nodes {
		if !n.Daemon.Running() {
			continue
		}
		vms, err := n.Client.List(e.ctx, nil)
		if err != nil {
			e.t.Fatalf("%s: listing VMs: %v", n.Name, err)
		}
		for _, vm := range vms {
			if vm.Metadata[zv1.DaemonKeyUID] != "" {
				out[n.Name] = append(out[n.Name], vm)
			}
		}
	}
	return out
}

func countVMs(m map[string][]daemon.Sandbox) int {
	n := 0
	for _, vms := range m {
		n += len(vms)
	}
	return n
}

func (e *env) exec(node, id string, argv ...string) string {
	e.t.Helper()
	n := e.c.Node(node)
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	r, err := n.Client.Exec(ctx, id, argv)
	if err != nil {
		e.t.Fatalf("exec %v in %s on %s: %v", argv, id, node, err)
	}
	if r.ExitCode == nil || *r.ExitCode != 0 {
		e.t.Fatalf("exec %v in %s: exit %v, stderr %q", argv, id, r.ExitCode, r.Stderr)
	}
	return r.Stdout
}

func (e *env) deleteAndWaitGone(objs ...client.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := e.cl.Delete(e.ctx, o); client.IgnoreNotFound(err) != nil {
			e.t.Fatalf("delete %s: %v", o.GetName(), err)
		}
	}
	for _, o := range objs {
		e.eventually("deleted "+o.GetName(), 90*time.Second, func() (bool, string) {
			err := e.cl.Get(e.ctx, client.ObjectKeyFromObject(o), o)
			return apierrors.IsNotFound(err), fmt.Sprintf("still there (finalizers %v)", o.GetFinalizers())
		})
	}
}

func image(name string, mem int32) *zv1.Sandbox {
	return &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
			Resources: &zv1.Resources{MemoryMiB: mem, VCPUs: 1}}}}
}

func TestCluster(t *testing.T) {
	bins, missing := cluster.FindBins()
	if missing != "" {
		t.Skip("skipping the Kubernetes e2e suite: " + missing)
	}
	// Short state dirs (QEMU's unix socket paths must stay under 108 bytes); kept on
	// failure with every log.
	dir, err := os.MkdirTemp("", "zk8s-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, bins, cluster.Options{Dir: dir, Nodes: 3, NodeMemoryMiB: 1024, NodeVCPUs: 4,
		LeaseDuration: 4 * time.Second, Grace: 3 * time.Second, Logf: t.Logf, Registry: true})
	e := &env{t: t, ctx: ctx, c: c}
	defer func() {
		if t.Failed() {
			for _, p := range []string{"controller.log", "node-a-agent.log", "node-b-agent.log", "node-c-agent.log"} {
				if b, err := os.ReadFile(filepath.Join(dir, p)); err == nil {
					lines := strings.Split(string(b), "\n")
					if len(lines) > 40 {
						lines = lines[len(lines)-40:]
					}
					t.Logf("---- tail of %s\n%s", p, strings.Join(lines, "\n"))
				}
			}
		}
		if c != nil {
			c.Stop(context.Background())
		}
		left := 0
		for _, n := range []string{"node-a", "node-b", "node-c"} {
			left += len(cluster.VMProcesses(filepath.Join(dir, n), true))
		}
		if left > 0 {
			t.Errorf("%d VM processes were left after the cluster stopped", left)
		}
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("logs and state kept in %s", dir)
		}
	}()
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	e.cl = c.Client

	t.Run("nodes report capacity and the image", func(t *testing.T) { e.t = t; e.nodesReport() })
	t.Run("schema validation refuses invalid specs", func(t *testing.T) { e.t = t; e.schemaValidation() })
	t.Run("manifests apply (server-side dry run)", func(t *testing.T) { e.t = t; e.manifests() })
	t.Run("sandbox placed, running, exec through its node's daemon", func(t *testing.T) { e.t = t; e.placeAndExec() })
	t.Run("branchFrom on the parent's node with the parent's files", func(t *testing.T) { e.t = t; e.branch() })
	t.Run("branch moved to another node as a snapshot pack when the parent's is full", func(t *testing.T) { e.t = t; e.movedBranch() })
	t.Run("ttlSeconds: the daemon deletes the VM, the Sandbox is Expired", func(t *testing.T) { e.t = t; e.ttl() })
	t.Run("warm pool of 3 kept full; claim binds within one reconcile", func(t *testing.T) { e.t = t; e.poolAndClaim() })
	t.Run("node daemon killed: Sandboxes Lost, pool refilled elsewhere", func(t *testing.T) { e.t = t; e.nodeLost() })
	t.Run("controller, node agent and daemon restarts create no duplicates", func(t *testing.T) { e.t = t; e.restarts() })
	t.Run("deleting Sandboxes leaves no VM", func(t *testing.T) { e.t = t; e.deleteAll() })
}

func (e *env) nodesReport() {
	var nodes zv1.ZygoteNodeList
	if err := e.cl.List(e.ctx, &nodes); err != nil {
		e.t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		e.t.Fatalf("want 3 ZygoteNodes, got %d", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		s := n.Status
		if s.Capacity == nil || s.Capacity.MemoryMiB != 1024 || s.Capacity.VCPUs != 4 || s.Runtime != "qemu" {
			e.t.Errorf("%s: capacity %+v runtime %q", n.Name, s.Capacity, s.Runtime)
		}
		has := false
		for _, i := range s.Images {
			has = has || i == "minimal"
		}
		if !has {
			e.t.Errorf("%s: images %v lack minimal", n.Name, s.Images)
		}
		if s.LeaseName != zv1.LeaseName(n.Name) || !strings.HasPrefix(s.DaemonURL, "http://127.0.0.1:") {
			e.t.Errorf("%s: lease %q url %q", n.Name, s.LeaseName, s.DaemonURL)
		}
	}
}

func (e *env) schemaValidation() {
	ttl0 := int64(0)
	cases := []struct {
		name string
		obj  client.Object
		want []string
	}{
		{"image and snapshot", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-1"},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal", Snapshot: "s"}}},
			[]string{"give exactly one of image, snapshot or branchFrom"}},
		{"nothing to start from", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-2"}},
			[]string{"give exactly one of image, snapshot or branchFrom"}},
		{"memory too small", image("bad-3", 10),
			[]string{"spec.resources.memoryMiB", "should be greater than or equal to 64"}},
		{"unknown network mode", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-4"},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
				Network: &zv1.NetworkPolicy{Mode: "bridge"}}}},
			[]string{"spec.network.mode", `Unsupported value: "bridge"`, `"egress"`, `"none"`}},
		{"bad CIDR", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-5"},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
				Network: &zv1.NetworkPolicy{AllowOut: []string{"example.com"}}}}},
			[]string{"spec.network.allowOut[0]", "should match"}},
		{"branch of 0", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-6"},
			Spec: zv1.SandboxSpec{BranchFrom: &zv1.BranchFrom{Sandbox: "p", Count: 0}}},
			nil}, // count 0 is defaulted to 1: accepted (deleted below)
		{"branch of 17", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-7"},
			Spec: zv1.SandboxSpec{BranchFrom: &zv1.BranchFrom{Sandbox: "p", Count: 17}}},
			[]string{"spec.branchFrom.count", "should be less than or equal to 16"}},
		{"resources on a branch", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-8"},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Resources: &zv1.Resources{MemoryMiB: 512}},
				BranchFrom: &zv1.BranchFrom{Sandbox: "p"}}},
			[]string{"resources apply to image boots only"}},
		{"ttl 0", &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-9"},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal", TTLSeconds: &ttl0}}},
			[]string{"spec.ttlSeconds", "should be greater than or equal to 1"}},
		{"pool of -1", &zv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-10"},
			Spec: zv1.SandboxWarmPoolSpec{Replicas: -1, SandboxTemplateRef: zv1.TemplateRef{Name: "t"}}},
			[]string{"spec.replicas", "should be greater than or equal to 0"}},
		{"template without image", &zv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-11"}},
			[]string{"give exactly one of image or snapshot"}},
		{"claim without template", &zv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-12"}},
			[]string{"spec.sandboxTemplateRef.name", "should be at least 1 chars long"}},
	}
	for _, tc := range cases {
		err := e.cl.Create(e.ctx, tc.obj)
		if tc.want == nil {
			if err != nil {
				e.t.Errorf("%s: refused: %v", tc.name, err)
			} else {
				if sb, ok := tc.obj.(*zv1.Sandbox); !ok || sb.Spec.BranchFrom.Count != 1 {
					e.t.Errorf("%s: count not defaulted to 1: %+v", tc.name, tc.obj)
				}
				_ = e.cl.Delete(e.ctx, tc.obj)
			}
			continue
		}
		if err == nil {
			e.t.Errorf("%s: accepted", tc.name)
			_ = e.cl.Delete(e.ctx, tc.obj)
			continue
		}
		if !apierrors.IsInvalid(err) {
			e.t.Errorf("%s: want 422 Invalid, got %v", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				e.t.Errorf("%s: message %q lacks %q", tc.name, err.Error(), w)
			}
		}
		e.t.Logf("%s -> %s", tc.name, err.Error())
	}
	// Transition rules: nodeName is set once; image/snapshot/branchFrom never switch.
	sb := image("pinned", 256)
	sb.Spec.NodeName = "no-such-node"
	if err := e.cl.Create(e.ctx, sb); err != nil {
		e.t.Fatalf("create pinned: %v", err)
	}
	defer e.deleteAndWaitGone(sb)
	sb.Spec.NodeName = "node-a"
	if err := e.cl.Update(e.ctx, sb); err == nil || !strings.Contains(err.Error(), "nodeName cannot change once set") {
		e.t.Errorf("moving nodeName: want refusal, got %v", err)
	}
	if err := e.cl.Get(e.ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
		e.t.Fatal(err)
	}
	sb.Spec.Image, sb.Spec.Snapshot = "", "snap"
	if err := e.cl.Update(e.ctx, sb); err == nil || !strings.Contains(err.Error(), "cannot switch between image, snapshot and branchFrom") {
		e.t.Errorf("switching image to snapshot: want refusal, got %v", err)
	}
	// A Sandbox pinned to a node that does not exist is Lost with the reason.
	e.eventually("pinned to a missing node is Lost", 30*time.Second, func() (bool, string) {
		got, err := e.sandbox("pinned")
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == zv1.PhaseLost && strings.Contains(readyReason(got), "does not exist"),
			string(got.Status.Phase) + " " + readyReason(got)
	})
}

func (e *env) manifests() {
	kubectl := filepath.Join(e.c.Bins.Assets, "kubectl")
	for _, dir := range []string{"crd", "rbac", "controller", "node", "default"} {
		path := filepath.Join(cluster.Root(), "config", dir)
		out, err := exec.Command(kubectl, "kustomize", path).Output()
		if err != nil {
			e.t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		cmd := exec.Command(kubectl, "--kubeconfig", e.c.Kubeconfig, "apply", "--dry-run=server", "-f", "-")
		cmd.Stdin = strings.NewReader(string(out))
		res, err := cmd.CombinedOutput()
		if err != nil {
			e.t.Fatalf("applying config/%s (server-side dry run): %v\n%s", dir, err, res)
		}
		e.t.Logf("config/%s: %d objects accepted (server-side dry run)", dir,
			strings.Count(string(res), "(server dry run)"))
	}
	// kubectl's printer columns come from the CRDs.
	out, err := exec.Command(kubectl, "--kubeconfig", e.c.Kubeconfig, "get", "znode").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "MEMORY-MIB") || !strings.Contains(string(out), "node-a") {
		e.t.Errorf("kubectl get znode: %v\n%s", err, out)
	}
}

func (e *env) placeAndExec() {
	sb := image("solo", 256)
	if err := e.cl.Create(e.ctx, sb); err != nil {
		e.t.Fatal(err)
	}
	got := e.waitRunning("solo", 120*time.Second)
	if got.Spec.NodeName == "" || got.Status.Node != got.Spec.NodeName || got.Status.SandboxID == "" {
		e.t.Fatalf("placement/status: %+v", got.Status)
	}
	c := meta.FindStatusCondition(got.Status.Conditions, zv1.ConditionScheduled)
	if c == nil || c.Reason != zv1.ReasonPlaced {
		e.t.Errorf("Scheduled condition: %+v", c)
	}
	if got.Status.Endpoints == nil || !strings.HasSuffix(got.Status.Endpoints.Exec, "/v1/sandboxes/"+got.Status.SandboxID+"/exec") {
		e.t.Errorf("endpoints: %+v", got.Status.Endpoints)
	}
	if !controllerContains(got.Finalizers, zv1.FinalizerVM) {
		e.t.Errorf("finalizers %v lack %s", got.Finalizers, zv1.FinalizerVM)
	}
	vm, err := e.c.Node(got.Spec.NodeName).Client.Get(e.ctx, got.Status.SandboxID)
	if err != nil || vm.Metadata[zv1.DaemonKeyUID] != string(got.UID) || vm.MemMiB != 256 {
		e.t.Fatalf("daemon VM: %+v %v", vm, err)
	}
	out := e.exec(got.Spec.NodeName, got.Status.SandboxID, "sh", "-c", "echo parent-data > /root/marker && hostname")
	if strings.TrimSpace(out) == "" {
		e.t.Errorf("exec printed nothing")
	}
	e.t.Logf("solo runs on %s as %s (hostname %s)", got.Spec.NodeName, got.Status.SandboxID, strings.TrimSpace(out))
}

func controllerContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (e *env) branch() {
	parent, err := e.sandbox("solo")
	if err != nil {
		e.t.Fatal(err)
	}
	kids := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kids"},
		Spec: zv1.SandboxSpec{BranchFrom: &zv1.BranchFrom{Sandbox: "solo", Count: 2}}}
	if err := e.cl.Create(e.ctx, kids); err != nil {
		e.t.Fatal(err)
	}
	got := e.waitRunning("kids", 120*time.Second)
	if got.Spec.NodeName != parent.Spec.NodeName {
		e.t.Fatalf("children on %s, parent on %s", got.Spec.NodeName, parent.Spec.NodeName)
	}
	if len(got.Status.SandboxIDs) != 2 {
		e.t.Fatalf("want 2 children, got %v", got.Status.SandboxIDs)
	}
	for _, id := range got.Status.SandboxIDs {
		if out := e.exec(got.Spec.NodeName, id, "cat", "/root/marker"); strings.TrimSpace(out) != "parent-data" {
			e.t.Errorf("child %s reads %q, want the parent's parent-data", id, out)
		}
		vm, err := e.c.Node(got.Spec.NodeName).Client.Get(e.ctx, id)
		if err != nil || vm.Metadata["zygote.parent"] != parent.Status.SandboxID || vm.Metadata[zv1.DaemonKeyUID] != string(got.UID) {
			e.t.Errorf("child %s metadata %v (%v)", id, vm.Metadata, err)
		}
	}
	// A branch too big for the parent's node is not moved elsewhere: the status says so.
	big := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "too-many"},
		Spec: zv1.SandboxSpec{BranchFrom: &zv1.BranchFrom{Sandbox: "solo", Count: 16}}}
	if err := e.cl.Create(e.ctx, big); err != nil {
		e.t.Fatal(err)
	}
	e.eventually("too-many is ParentNodeFull", 30*time.Second, func() (bool, string) {
		sb, err := e.sandbox("too-many")
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionScheduled)
		return c != nil && c.Reason == zv1.ReasonParentNodeFull && sb.Spec.NodeName == "" &&
			strings.Contains(c.Message, "4096 MiB"), readyReason(sb)
	})
	e.deleteAndWaitGone(big, got, parent)
	e.eventually("no VM left", 60*time.Second, func() (bool, string) {
		m := e.labelledVMs()
		return countVMs(m) == 0, fmt.Sprintf("%v", m)
	})
}

func (e *env) movedBranch() {
	if e.c.RegistryAddr == "" {
		e.t.Skip("no loopback registry: " + e.c.NoRegistry)
	}
	parent := image("big", 512)
	if err := e.cl.Create(e.ctx, parent); err != nil {
		e.t.Fatal(err)
	}
	p := e.waitRunning("big", 120*time.Second)
	e.exec(p.Spec.NodeName, p.Status.SandboxID, "sh", "-c", "echo moved-data > /root/marker")
	repo := e.c.RegistryAddr + "/zygote/branch-points"
	moved := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "moved"},
		Spec: zv1.SandboxSpec{BranchFrom: &zv1.BranchFrom{Sandbox: "big", Count: 2,
			SnapshotPack: &zv1.SnapshotPackMove{Repository: repo}}}}
	if err := e.cl.Create(e.ctx, moved); err != nil {
		e.t.Fatal(err)
	}
	got := e.waitRunning("moved", 300*time.Second)
	if got.Spec.NodeName == p.Spec.NodeName {
		e.t.Fatalf("children on the parent's node %s, which had no room for them", got.Spec.NodeName)
	}
	c := meta.FindStatusCondition(got.Status.Conditions, zv1.ConditionScheduled)
	if c == nil || c.Reason != zv1.ReasonMovedAsPack || !strings.Contains(c.Message, repo) {
		e.t.Errorf("Scheduled: %+v", c)
	} else {
		e.t.Logf("moved: %s", c.Message)
	}
	if len(got.Status.SandboxIDs) != 2 {
		e.t.Fatalf("want 2 children, got %v", got.Status.SandboxIDs)
	}
	for _, id := range got.Status.SandboxIDs {
		if out := e.exec(got.Spec.NodeName, id, "cat", "/root/marker"); strings.TrimSpace(out) != "moved-data" {
			e.t.Errorf("child %s on %s reads %q, want the parent's moved-data", id, got.Spec.NodeName, out)
		}
	}
	p, err := e.sandbox("big")
	if err != nil {
		e.t.Fatal(err)
	}
	if len(p.Status.Packs) != 1 || p.Status.Packs[0].Reference != repo+":"+string(got.UID) ||
		!strings.HasPrefix(p.Status.Packs[0].Digest, "sha256:") {
		e.t.Errorf("parent's packs: %+v", p.Status.Packs)
	}
	e.deleteAndWaitGone(got, p)
	e.eventually("no VM left", 60*time.Second, func() (bool, string) {
		m := e.labelledVMs()
		return countVMs(m) == 0, fmt.Sprintf("%v", m)
	})
}

func (e *env) ttl() {
	sb := image("short", 128)
	ttl := int64(2)
	sb.Spec.TTLSeconds = &ttl
	if err := e.cl.Create(e.ctx, sb); err != nil {
		e.t.Fatal(err)
	}
	got := e.waitRunning("short", 120*time.Second)
	if got.Status.ExpiresAt == nil {
		e.t.Errorf("no expiresAt: %+v", got.Status)
	}
	e.eventually("short Expired", 60*time.Second, func() (bool, string) {
		cur, err := e.sandbox("short")
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, zv1.ConditionReady)
		return cur.Status.Phase == zv1.PhaseExpired && c != nil && c.Reason == zv1.ReasonTTLExpired,
			string(cur.Status.Phase) + " " + readyReason(cur)
	})
	if _, err := e.c.Node(got.Spec.NodeName).Client.Get(e.ctx, got.Status.SandboxID); !daemon.IsNotFound(err) {
		e.t.Errorf("the expired VM %s is still on the daemon: %v", got.Status.SandboxID, err)
	}
	e.deleteAndWaitGone(got)
}

func (e *env) setUnschedulable(v bool) {
	for _, n := range e.c.Nodes {
		var zn zv1.ZygoteNode
		if err := e.cl.Get(e.ctx, client.ObjectKey{Name: n.Name}, &zn); err != nil {
			e.t.Fatal(err)
		}
		patch := client.MergeFrom(zn.DeepCopy())
		zn.Spec.Unschedulable = v
		if err := e.cl.Patch(e.ctx, &zn, patch); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) poolMembers() []zv1.Sandbox {
	var list zv1.SandboxList
	if err := e.cl.List(e.ctx, &list, client.InNamespace(ns), client.MatchingLabels{zv1.LabelPool: "warm"}); err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

// waitPoolFull waits for 3 Running members, returns them.
func (e *env) waitPoolFull(timeout time.Duration) []zv1.Sandbox {
	var members []zv1.Sandbox
	e.eventually("pool warm has 3 ready", timeout, func() (bool, string) {
		members = e.poolMembers()
		var p zv1.SandboxWarmPool
		if err := e.cl.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: "warm"}, &p); err != nil {
			return false, err.Error()
		}
		running, desc := 0, []string{}
		for _, m := range members {
			if m.Status.Phase == zv1.PhaseRunning && m.DeletionTimestamp.IsZero() {
				running++
			}
			desc = append(desc, m.Name+"="+string(m.Status.Phase)+"@"+m.Spec.NodeName)
		}
		return running == 3 && len(members) == 3 && p.Status.ReadyReplicas == 3,
			fmt.Sprintf("members %v, status %+v", desc, p.Status)
	})
	return members
}

func (e *env) poolAndClaim() {
	tmpl := &zv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"},
		Spec: zv1.SandboxTemplateSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
			Resources: &zv1.Resources{MemoryMiB: 256, VCPUs: 1}}}}
	pool := &zv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: zv1.SandboxWarmPoolSpec{Replicas: 3, SandboxTemplateRef: zv1.TemplateRef{Name: "small"}}}
	for _, o := range []client.Object{tmpl, pool} {
		if err := e.cl.Create(e.ctx, o); err != nil {
			e.t.Fatal(err)
		}
	}
	members := e.waitPoolFull(180 * time.Second)
	nodes := map[string]bool{}
	for _, m := range members {
		nodes[m.Spec.NodeName] = true
	}
	if len(nodes) != 3 {
		e.t.Errorf("pool members not spread over the 3 nodes: %v", nodes)
	}
	warmNames := map[string]bool{}
	for _, m := range members {
		warmNames[m.Name] = true
	}
	// Cordon every node so the pool's refill waits (at most 3 VMs run in this test).
	e.setUnschedulable(true)
	claim := &zv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-1"},
		Spec: zv1.SandboxClaimSpec{SandboxTemplateRef: zv1.TemplateRef{Name: "small"}}}
	if err := e.cl.Create(e.ctx, claim); err != nil {
		e.t.Fatal(err)
	}
	// Within one reconcile: the first status the claim gets already holds a running
	// warm Sandbox (no Pending in between).
	var got zv1.SandboxClaim
	e.eventually("claim bound", 30*time.Second, func() (bool, string) {
		if err := e.cl.Get(e.ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err.Error()
		}
		return got.Status.Sandbox != nil, fmt.Sprintf("%+v", got.Status)
	})
	c := meta.FindStatusCondition(got.Status.Conditions, zv1.ConditionBound)
	if got.Status.Phase != zv1.ClaimBound || c == nil || c.Reason != zv1.ReasonFromWarmPool ||
		!warmNames[got.Status.Sandbox.Name] || got.Status.SandboxID == "" || got.Status.Endpoints == nil {
		e.t.Fatalf("claim status: %+v", got.Status)
	}
	e.t.Logf("claim bound %s (%s) on %s: %s", got.Status.Sandbox.Name, got.Status.SandboxID, got.Status.Node, c.Message)
	bound, err := e.sandbox(got.Status.Sandbox.Name)
	if err != nil {
		e.t.Fatal(err)
	}
	if bound.Labels[zv1.LabelPool] != "" || bound.Labels[zv1.LabelClaim] != "job-1" ||
		metav1.GetControllerOf(bound).Kind != "SandboxClaim" {
		e.t.Errorf("bound Sandbox labels %v owner %+v", bound.Labels, metav1.GetControllerOf(bound))
	}
	out := e.exec(got.Status.Node, got.Status.SandboxID, "echo", "claimed")
	if strings.TrimSpace(out) != "claimed" {
		e.t.Errorf("exec in the claimed sandbox: %q", out)
	}
	// The pool noticed at once: a replacement exists, waiting for a schedulable node.
	e.eventually("replacement pending", 30*time.Second, func() (bool, string) {
		for _, m := range e.poolMembers() {
			if !warmNames[m.Name] {
				cond := meta.FindStatusCondition(m.Status.Conditions, zv1.ConditionScheduled)
				return cond != nil && cond.Reason == zv1.ReasonUnschedulable &&
					strings.Contains(cond.Message, "unschedulable"), readyReason(&m)
			}
		}
		return false, "no replacement yet"
	})
	// Deleting the claim deletes its Sandbox and VM; uncordoned, the pool is full again.
	e.deleteAndWaitGone(claim)
	e.eventually("claimed Sandbox deleted with its claim", 60*time.Second, func() (bool, string) {
		_, err := e.sandbox(got.Status.Sandbox.Name)
		return apierrors.IsNotFound(err), fmt.Sprintf("%v", err)
	})
	e.setUnschedulable(false)
	e.waitPoolFull(120 * time.Second)
	if n := countVMs(e.labelledVMs()); n != 3 {
		e.t.Errorf("want 3 VMs (the pool), daemons run %d", n)
	}
}

func (e *env) nodeLost() {
	members := e.waitPoolFull(60 * time.Second)
	victim := e.c.Node(members[0].Spec.NodeName)
	lostName := members[0].Name
	// Watch (the pool deletes a Lost member at once: polling could miss the state).
	wc, err := client.NewWithWatch(e.c.Config, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := wc.Watch(e.ctx, &zv1.SandboxList{}, client.InNamespace(ns))
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Stop()
	t0 := time.Now()
	killed := e.c.KillHost(victim)
	e.t.Logf("killed %s's daemon and %d VM processes", victim.Name, killed)
	var lostAt time.Duration
	timeout := time.After(60 * time.Second)
	for lostAt == 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				e.t.Fatal("watch closed")
			}
			sb, isSB := ev.Object.(*zv1.Sandbox)
			if !isSB || sb.Name != lostName || sb.Status.Phase != zv1.PhaseLost {
				continue
			}
			c := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionReady)
			if c == nil || c.Reason != zv1.ReasonNodeLost || !strings.Contains(c.Message, "stopped renewing its Lease") {
				e.t.Fatalf("Lost without the reason: %+v", c)
			}
			lostAt = time.Since(t0)
			e.t.Logf("%s Lost: %s", lostName, c.Message)
		case <-timeout:
			e.t.Fatalf("%s not marked Lost within 60s", lostName)
		}
	}
	var zn zv1.ZygoteNode
	if err := e.cl.Get(e.ctx, client.ObjectKey{Name: victim.Name}, &zn); err != nil {
		e.t.Fatal(err)
	}
	if c := meta.FindStatusCondition(zn.Status.Conditions, zv1.ConditionReady); c == nil || c.Status == metav1.ConditionTrue {
		e.t.Errorf("dead node %s still Ready: %+v", victim.Name, c)
	}
	members = e.waitPoolFull(120 * time.Second)
	refilled := time.Since(t0)
	for _, m := range members {
		if m.Spec.NodeName == victim.Name {
			e.t.Errorf("pool member %s placed on the dead node", m.Name)
		}
	}
	e.t.Logf("node %s killed: its Sandbox Lost after %.1fs, pool full again after %.1fs (lease 4s, grace 3s)",
		victim.Name, lostAt.Seconds(), refilled.Seconds())
	// The host comes back: the daemon restarts on its state, the node is Ready again,
	// and what it remembers of the lost Sandbox is deleted (no Sandbox owns it).
	if err := victim.Daemon.Start(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.WaitDaemon(e.ctx, victim, 60*time.Second); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.WaitNodeReady(e.ctx, victim.Name, 60*time.Second); err != nil {
		e.t.Fatal(err)
	}
	e.eventually("returned node holds no orphan VM", 60*time.Second, func() (bool, string) {
		vms := e.labelledVMs()[victim.Name]
		return len(vms) == 0, fmt.Sprintf("%d labelled VMs: %+v", len(vms), vms)
	})
}

// snapshotState: Sandbox names with their daemon ids, and the labelled VM ids.
func (e *env) snapshotState() (map[string]string, []string) {
	var list zv1.SandboxList
	if err := e.cl.List(e.ctx, &list, client.InNamespace(ns)); err != nil {
		e.t.Fatal(err)
	}
	sbs := map[string]string{}
	for _, sb := range list.Items {
		sbs[sb.Name] = sb.Status.SandboxID
	}
	var ids []string
	for _, vms := range e.labelledVMs() {
		for _, vm := range vms {
			ids = append(ids, vm.ID)
		}
	}
	sort.Strings(ids)
	return sbs, ids
}

func (e *env) restarts() {
	e.waitPoolFull(60 * time.Second)
	sbs, ids := e.snapshotState()
	if len(ids) != 3 {
		e.t.Fatalf("want 3 VMs before the restarts, got %v", ids)
	}
	e.c.Controller.Stop(syscall.SIGKILL)
	for _, n := range e.c.Nodes {
		n.Agent.Stop(syscall.SIGKILL)
	}
	// A claim made while the controller is down binds once it is back.
	claim := &zv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-2"},
		Spec: zv1.SandboxClaimSpec{SandboxTemplateRef: zv1.TemplateRef{Name: "small"}, WarmPool: "warm"}}
	e.setUnschedulable(true)
	if err := e.cl.Create(e.ctx, claim); err != nil {
		e.t.Fatal(err)
	}
	restarted := time.Now()
	for _, n := range e.c.Nodes {
		if err := n.Agent.Start(); err != nil {
			e.t.Fatal(err)
		}
	}
	// The agents renew their Leases before the controller is back (else a slow start
	// on a loaded machine could outlast lease + grace, and the nodes be judged lost).
	for _, n := range e.c.Nodes {
		e.eventually(n.Name+"'s Lease renewed", 60*time.Second, func() (bool, string) {
			var l coordinationv1.Lease
			err := e.cl.Get(e.ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: zv1.LeaseName(n.Name)}, &l)
			if err != nil || l.Spec.RenewTime == nil {
				return false, fmt.Sprintf("%v", err)
			}
			return l.Spec.RenewTime.After(restarted), "last renewed " + l.Spec.RenewTime.String()
		})
	}
	if err := e.c.Controller.Start(); err != nil {
		e.t.Fatal(err)
	}
	var got zv1.SandboxClaim
	e.eventually("claim bound after the restart", 60*time.Second, func() (bool, string) {
		if err := e.cl.Get(e.ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == zv1.ClaimBound, fmt.Sprintf("%+v", got.Status)
	})
	// A daemon killed and restarted at once (its VMs live on under their supervisors)
	// re-attaches to them, and its node agent keeps the same VMs.
	victim := e.c.Nodes[0]
	victim.Daemon.Stop(syscall.SIGKILL)
	t0 := time.Now()
	if err := victim.Daemon.Start(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.c.WaitDaemon(e.ctx, victim, 30*time.Second); err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("%s's zygoted restarted in %.2fs", victim.Name, time.Since(t0).Seconds())
	// Let every reconciler settle (several resyncs), then compare.
	time.Sleep(8 * time.Second)
	after, idsAfter := e.snapshotState()
	if strings.Join(ids, ",") != strings.Join(idsAfter, ",") {
		e.t.Errorf("VMs changed across restarts: before %v, after %v", ids, idsAfter)
	}
	var list zv1.SandboxList
	if err := e.cl.List(e.ctx, &list, client.InNamespace(ns)); err != nil {
		e.t.Fatal(err)
	}
	for _, sb := range list.Items {
		if sb.Status.Phase.Terminal() {
			e.t.Errorf("%s is %s after the restarts: %s", sb.Name, sb.Status.Phase, readyReason(&sb))
		}
	}
	for name, id := range sbs {
		if after[name] != id {
			e.t.Errorf("Sandbox %s: daemon id %q before, %q after", name, id, after[name])
		}
	}
	// The claim took one member; the pool's replacement waits (all cordoned): one new
	// Sandbox, unplaced, and nothing else.
	if len(after) != len(sbs)+1 {
		e.t.Errorf("Sandboxes before %v, after %v: want exactly one new (the pool's pending replacement)", sbs, after)
	}
	for name, id := range after {
		if _, ok := sbs[name]; !ok && id != "" {
			e.t.Errorf("new Sandbox %s got a VM %s while every node is cordoned", name, id)
		}
	}
	e.deleteAndWaitGone(&got)
	e.setUnschedulable(false)
	e.waitPoolFull(120 * time.Second)
}

func (e *env) deleteAll() {
	var p zv1.SandboxWarmPool
	if err := e.cl.Get(e.ctx, client.ObjectKey{Namespace: ns, Name: "warm"}, &p); err != nil {
		e.t.Fatal(err)
	}
	e.deleteAndWaitGone(&p)
	e.eventually("pool members deleted", 90*time.Second, func() (bool, string) {
		m := e.poolMembers()
		return len(m) == 0, fmt.Sprintf("%d left", len(m))
	})
	e.eventually("no VM left on any daemon", 60*time.Second, func() (bool, string) {
		m := e.labelledVMs()
		return countVMs(m) == 0, fmt.Sprintf("%v", m)
	})
	for _, n := range e.c.Nodes {
		if pids := cluster.VMProcesses(n.StateDir, false); len(pids) > 0 {
			e.t.Errorf("%s: VM processes still running: %v", n.Name, pids)
		}
	}
}
