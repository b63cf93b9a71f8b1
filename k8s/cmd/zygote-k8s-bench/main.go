// zygote-k8s-bench measures zygote on Kubernetes on a loopback cluster (the e2e
// suite's: etcd + kube-apiserver, the controller, N zygoted + node agents on the qemu
// runtime): claim latency from a warm pool, create-to-running through the API server
// vs directly on a daemon, time to mark Lost and refill after a node dies, the memory
// of each program, and many Sandboxes across the nodes. Prints a summary and, last, one
// JSON line. Run by `make bench-k8s` (scripts/k8s-bench.sh).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
	"zygote.dev/k8s/test/cluster"
)

const ns = "default"

var (
	claims    = flag.Int("claims", 10, "claims bound from a warm pool of 3")
	creates   = flag.Int("creates", 10, "create-to-running rounds (API server and daemon, interleaved)")
	kills     = flag.Int("kills", 3, "node deaths (Lost + refill)")
	branches  = flag.Int("branches", 5, "branches on the parent's node vs moved to another node as a snapshot pack")
	scale     = flag.Int("scale", 100, "Sandboxes created at once across the nodes (0: skip)")
	scaleMem  = flag.Int("scale-mem", 64, "guest MiB of each scale Sandbox")
	nodes     = flag.Int("nodes", 3, "nodes")
	nodeMem   = flag.Int64("node-mem", 4096, "MiB each node offers")
	lease     = flag.Duration("lease", 3*time.Second, "node Lease duration")
	grace     = flag.Duration("grace", 2*time.Second, "controller grace after a Lease expires")
	scaleWait = flag.Duration("scale-timeout", 20*time.Minute, "how long the scale step may take")
)

type stats struct {
	N                int
	Median, P90, Max float64
	Samples          []float64 `json:",omitempty"`
}

func summarize(xs []float64) stats {
	if len(xs) == 0 {
		return stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 {
		i := int(p*float64(len(s)-1) + 0.5)
		return s[i]
	}
	return stats{N: len(s), Median: q(0.5), P90: q(0.9), Max: s[len(s)-1], Samples: xs}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type bench struct {
	ctx context.Context
	c   *cluster.Cluster
	wc  client.WithWatch
}

// waitFor watches Sandboxes (or claims) until cond holds for the named object.
func (b *bench) waitWatch(list client.ObjectList, name string, timeout time.Duration, cond func(client.Object) bool) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	w, err := b.wc.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return fmt.Errorf("watch error: %v", ev.Object)
		}
		o, ok := ev.Object.(client.Object)
		if ok && o.GetName() == name && cond(o) {
			return nil
		}
	}
	return fmt.Errorf("%s: not within %s", name, timeout)
}

func (b *bench) poolFull(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var list zv1.SandboxList
		if err := b.c.Client.List(b.ctx, &list, client.InNamespace(ns), client.MatchingLabels{zv1.LabelPool: "warm"}); err != nil {
			return err
		}
		running := 0
		for _, sb := range list.Items {
			if sb.Status.Phase == zv1.PhaseRunning && sb.DeletionTimestamp.IsZero() {
				running++
			}
		}
		if running == 3 && len(list.Items) == 3 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pool not full within %s", timeout)
}

func (b *bench) deleteWait(o client.Object) error {
	if err := b.c.Client.Delete(b.ctx, o); client.IgnoreNotFound(err) != nil {
		return err
	}
	for i := 0; i < 600; i++ {
		if err := b.c.Client.Get(b.ctx, client.ObjectKeyFromObject(o), o); client.IgnoreNotFound(err) == nil && err != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not deleted", o.GetName())
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// memory of each program (MiB of RSS).
func (b *bench) memory() map[string]float64 {
	m := map[string]float64{"controller": float64(rssKiB(b.c.Controller.Pid())) / 1024}
	for _, n := range b.c.Nodes {
		m[n.Name+"/zygoted"] = float64(rssKiB(n.Daemon.Pid())) / 1024
		m[n.Name+"/agent"] = float64(rssKiB(n.Agent.Pid())) / 1024
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
			if strings.HasPrefix(exe, b.c.Bins.Assets) && filepath.Base(exe) == name {
				m[name] = float64(rssKiB(pid)) / 1024
			}
		}
	}
	return m
}

func main() {
	flag.Parse()
	bins, missing := cluster.FindBins()
	if missing != "" {
		fmt.Println("cannot run: " + missing)
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "zk8sb-")
	must(err)
	ctx := context.Background()
	logf := func(f string, a ...any) { fmt.Printf("[bench] "+f+"\n", a...) }
	c, err := cluster.Start(ctx, bins, cluster.Options{Dir: dir, Nodes: *nodes, NodeMemoryMiB: *nodeMem,
		NodeVCPUs: 64, LeaseDuration: *lease, Grace: *grace, Logf: logf, Registry: true})
	if c != nil {
		defer func() { c.Stop(ctx); os.RemoveAll(dir) }()
	}
	must(err)
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: cluster.Scheme()})
	must(err)
	b := &bench{ctx: ctx, c: c, wc: wc}
	out := map[string]any{"nodes": *nodes, "lease_s": lease.Seconds(), "grace_s": grace.Seconds()}
	out["memory_idle_mib"] = b.memory()

	// 1. Create-to-running: through the API server vs directly on a daemon.
	var viaAPI, direct []float64
	for i := 0; i < *creates; i++ {
		name := fmt.Sprintf("c2r-%d", i)
		sb := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
				Resources: &zv1.Resources{MemoryMiB: 256, VCPUs: 1}}}}
		t0 := time.Now()
		must(c.Client.Create(ctx, sb))
		must(b.waitWatch(&zv1.SandboxList{}, name, 2*time.Minute, func(o client.Object) bool {
			return o.(*zv1.Sandbox).Status.Phase == zv1.PhaseRunning
		}))
		viaAPI = append(viaAPI, ms(time.Since(t0)))
		must(b.deleteWait(sb))
		n := c.Nodes[i%len(c.Nodes)]
		t0 = time.Now()
		vms, err := n.Client.Create(ctx, daemon.CreateRequest{Image: "minimal", MemMiB: 256, VCPUs: 1})
		must(err)
		direct = append(direct, ms(time.Since(t0)))
		must(n.Client.Delete(ctx, vms[0].ID))
	}
	out["create_to_running_apiserver_ms"], out["create_to_running_daemon_ms"] = summarize(viaAPI), summarize(direct)
	logf("create-to-running: API server %+v ms; daemon %+v ms", summarize(viaAPI), summarize(direct))

	// 1b. A branch on the parent's node vs moved to another node as a snapshot pack.
	if c.RegistryAddr != "" && *branches > 0 {
		runBranches(b, out, logf)
	}

	// 2. Claim latency from a warm pool of 3.
	tmpl := &zv1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "small"},
		Spec: zv1.SandboxTemplateSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
			Resources: &zv1.Resources{MemoryMiB: 256, VCPUs: 1}}}}
	pool := &zv1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: zv1.SandboxWarmPoolSpec{Replicas: 3, SandboxTemplateRef: zv1.TemplateRef{Name: "small"}}}
	must(c.Client.Create(ctx, tmpl))
	must(c.Client.Create(ctx, pool))
	var claimMs, refillMs []float64
	for i := 0; i < *claims; i++ {
		must(b.poolFull(2 * time.Minute))
		name := fmt.Sprintf("claim-%d", i)
		cl := &zv1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: zv1.SandboxClaimSpec{SandboxTemplateRef: zv1.TemplateRef{Name: "small"}}}
		t0 := time.Now()
		must(c.Client.Create(ctx, cl))
		must(b.waitWatch(&zv1.SandboxClaimList{}, name, time.Minute, func(o client.Object) bool {
			return o.(*zv1.SandboxClaim).Status.Phase == zv1.ClaimBound
		}))
		claimMs = append(claimMs, ms(time.Since(t0)))
		must(b.poolFull(2 * time.Minute))
		refillMs = append(refillMs, ms(time.Since(t0)))
		must(b.deleteWait(cl))
	}
	out["claim_bound_ms"], out["claim_pool_refilled_ms"] = summarize(claimMs), summarize(refillMs)
	logf("claim from warm pool: bound %+v ms; pool full again %+v ms", summarize(claimMs), summarize(refillMs))

	// 3. A node dies: Lost, then the pool is full again on the others.
	var lostMs, refilledMs []float64
	for i := 0; i < *kills; i++ {
		must(b.poolFull(2 * time.Minute))
		var list zv1.SandboxList
		must(c.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{zv1.LabelPool: "warm"}))
		victim := c.Node(list.Items[0].Spec.NodeName)
		w, err := wc.Watch(ctx, &zv1.SandboxList{}, client.InNamespace(ns))
		must(err)
		t0 := time.Now()
		c.KillHost(victim)
		lost := time.Duration(0)
		for lost == 0 {
			select {
			case ev := <-w.ResultChan():
				if sb, ok := ev.Object.(*zv1.Sandbox); ok && sb.Name == list.Items[0].Name && sb.Status.Phase == zv1.PhaseLost {
					lost = time.Since(t0)
				}
			case <-time.After(2 * time.Minute):
				must(fmt.Errorf("not Lost in 2 min"))
			}
		}
		w.Stop()
		lostMs = append(lostMs, ms(lost))
		must(b.poolFull(2 * time.Minute))
		refilledMs = append(refilledMs, ms(time.Since(t0)))
		must(victim.Daemon.Start())
		must(c.WaitDaemon(ctx, victim, time.Minute))
		must(c.WaitNodeReady(ctx, victim.Name, time.Minute))
	}
	out["node_lost_ms"], out["node_lost_refilled_ms"] = summarize(lostMs), summarize(refilledMs)
	logf("node death: Lost after %+v ms; pool full again after %+v ms", summarize(lostMs), summarize(refilledMs))
	out["memory_pool_mib"] = b.memory()
	must(b.deleteWait(pool))
	for i := 0; i < 300; i++ {
		var list zv1.SandboxList
		must(c.Client.List(ctx, &list, client.InNamespace(ns)))
		if len(list.Items) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// 4. Many Sandboxes at once across the nodes.
	if *scale > 0 {
		runScale(b, out, logf)
	}
	js, _ := json.Marshal(out)
	fmt.Println(string(js))
}

func cordon(b *bench, node string, v bool) {
	var zn zv1.ZygoteNode
	must(b.c.Client.Get(b.ctx, client.ObjectKey{Name: node}, &zn))
	patch := client.MergeFrom(zn.DeepCopy())
	zn.Spec.Unschedulable = v
	must(b.c.Client.Patch(b.ctx, &zn, patch))
}

func runBranches(b *bench, out map[string]any, logf func(string, ...any)) {
	ctx, c := b.ctx, b.c
	running := func(name string) {
		must(b.waitWatch(&zv1.SandboxList{}, name, 5*time.Minute, func(o client.Object) bool {
			sb := o.(*zv1.Sandbox)
			if sb.Status.Phase.Terminal() {
				must(fmt.Errorf("%s is %s", name, sb.Status.Phase))
			}
			return sb.Status.Phase == zv1.PhaseRunning
		}))
	}
	parent := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bp"},
		Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
			Resources: &zv1.Resources{MemoryMiB: 256, VCPUs: 1}}}}
	must(c.Client.Create(ctx, parent))
	running("bp")
	must(c.Client.Get(ctx, client.ObjectKeyFromObject(parent), parent))
	repo := c.RegistryAddr + "/zygote/branch-points"
	var local, moved []float64
	for i := 0; i < *branches; i++ {
		for _, move := range []bool{false, true} {
			name := fmt.Sprintf("bl-%d", i)
			bf := &zv1.BranchFrom{Sandbox: "bp", Count: 1}
			if move {
				name = fmt.Sprintf("bm-%d", i)
				bf.SnapshotPack = &zv1.SnapshotPackMove{Repository: repo}
				cordon(b, parent.Spec.NodeName, true) // the parent's node takes nothing more
			}
			sb := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: zv1.SandboxSpec{BranchFrom: bf}}
			t0 := time.Now()
			must(c.Client.Create(ctx, sb))
			running(name)
			d := ms(time.Since(t0))
			must(c.Client.Get(ctx, client.ObjectKeyFromObject(sb), sb))
			if move {
				if sb.Spec.NodeName == parent.Spec.NodeName {
					must(fmt.Errorf("%s was not moved", name))
				}
				moved = append(moved, d)
				cordon(b, parent.Spec.NodeName, false)
			} else {
				local = append(local, d)
			}
			must(b.deleteWait(sb))
		}
	}
	must(b.deleteWait(parent))
	out["branch_local_ms"], out["branch_moved_pack_ms"] = summarize(local), summarize(moved)
	logf("branch create-to-running: on the parent's node %+v ms; moved as a snapshot pack %+v ms",
		summarize(local), summarize(moved))
}

func runScale(b *bench, out map[string]any, logf func(string, ...any)) {
	ctx, c := b.ctx, b.c
	w, err := b.wc.Watch(ctx, &zv1.SandboxList{}, client.InNamespace(ns))
	must(err)
	defer w.Stop()
	placedAt, runningAt := map[string]time.Duration{}, map[string]time.Duration{}
	t0 := time.Now()
	for i := 0; i < *scale; i++ {
		sb := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("many-%03d", i)},
			Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
				Resources: &zv1.Resources{MemoryMiB: int32(*scaleMem), VCPUs: 1}}}}
		must(c.Client.Create(ctx, sb))
	}
	created := time.Since(t0)
	perNode := map[string]int{}
	failed := map[string]string{}
	deadline := time.After(*scaleWait)
	for len(runningAt)+len(failed) < *scale {
		select {
		case ev := <-w.ResultChan():
			sb, ok := ev.Object.(*zv1.Sandbox)
			if !ok {
				continue
			}
			if _, seen := placedAt[sb.Name]; !seen && sb.Spec.NodeName != "" {
				placedAt[sb.Name] = time.Since(t0)
			}
			if _, seen := runningAt[sb.Name]; !seen && sb.Status.Phase == zv1.PhaseRunning {
				runningAt[sb.Name] = time.Since(t0)
				perNode[sb.Spec.NodeName]++
			}
			if sb.Status.Phase == zv1.PhaseFailed {
				if cnd := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionReady); cnd != nil {
					failed[sb.Name] = cnd.Message
				}
			}
		case <-deadline:
			logf("scale: only %d of %d running after %s", len(runningAt), *scale, *scaleWait)
			goto done
		}
	}
done:
	var placed, running []float64
	var lastPlaced, lastRunning time.Duration
	for _, d := range placedAt {
		placed = append(placed, ms(d))
		if d > lastPlaced {
			lastPlaced = d
		}
	}
	for _, d := range runningAt {
		running = append(running, ms(d))
		if d > lastRunning {
			lastRunning = d
		}
	}
	res := map[string]any{
		"count": *scale, "guest_mib": *scaleMem, "created_all_ms": ms(created),
		"placed": len(placedAt), "all_placed_ms": ms(lastPlaced), "placed_ms": summarize(placed),
		"running": len(runningAt), "all_running_ms": ms(lastRunning), "running_ms": summarize(running),
		"per_node": perNode, "failed": len(failed),
	}
	for _, s := range []string{"placed_ms", "running_ms"} {
		st := res[s].(stats)
		st.Samples = nil
		res[s] = st
	}
	if len(failed) > 0 {
		for n, m := range failed {
			res["first_failure"] = n + ": " + m
			break
		}
	}
	res["memory_mib"] = b.memory()
	var avail int64
	if bs, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(bs), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
				avail, _ = strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	res["host_mem_available_mib"] = avail / 1024
	out["scale"] = res
	logf("scale: %d Sandboxes: all placed in %.0f ms, %d running, last at %.0f ms; per node %v; failed %d",
		*scale, ms(lastPlaced), len(runningAt), ms(lastRunning), perNode, len(failed))
	t1 := time.Now()
	var list zv1.SandboxList
	must(c.Client.List(ctx, &list, client.InNamespace(ns)))
	for i := range list.Items {
		_ = c.Client.Delete(ctx, &list.Items[i])
	}
	for i := 0; i < 3000; i++ {
		must(c.Client.List(ctx, &list, client.InNamespace(ns)))
		if len(list.Items) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res["delete_all_ms"] = ms(time.Since(t1))
	logf("scale: deleted all in %.0f ms", ms(time.Since(t1)))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
