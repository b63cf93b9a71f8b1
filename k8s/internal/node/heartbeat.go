package node

import (
	"context"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
)

// Heartbeat renews the node's Lease while its daemon answers, keeps its ZygoteNode's
// status (capacity, runtimes, images, snapshots, usage) and deletes VMs no Sandbox
// owns any more (the Sandboxes of a node that was lost and came back).
type Heartbeat struct {
	Client    client.Client
	APIReader client.Reader
	Daemon    *daemon.Client
	Node      string
	// Namespace of the Lease.
	Namespace     string
	LeaseDuration time.Duration
	// AdvertiseURL of the daemon.
	AdvertiseURL string
	// Capacity offered (MemoryMiB 0: 90% of MemTotal; VCPUs 0: the host's CPUs).
	Capacity zv1.NodeCapacity
	// StatusInterval: how often the ZygoteNode status is refreshed; GCInterval: orphan VMs.
	StatusInterval, GCInterval time.Duration
}

// NeedLeaderElection: every node agent runs its own heartbeat.
func (h *Heartbeat) NeedLeaderElection() bool { return false }

// Start runs until ctx ends.
func (h *Heartbeat) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("heartbeat")
	renew := h.LeaseDuration / 4
	if renew < 250*time.Millisecond {
		renew = 250 * time.Millisecond
	}
	t := time.NewTicker(renew)
	defer t.Stop()
	var lastStatus, lastGC time.Time
	healthy := false
	for {
		err := h.Daemon.Healthz(ctx)
		if err != nil {
			if healthy {
				logger.Info("daemon stopped answering: not renewing the Lease", "error", err.Error())
			}
			healthy = false
		} else {
			if !healthy {
				logger.Info("daemon answers: renewing the Lease")
				lastStatus = time.Time{}
			}
			healthy = true
			if err := h.renew(ctx); err != nil && ctx.Err() == nil {
				logger.Error(err, "renewing the Lease")
			}
			if time.Since(lastStatus) >= h.StatusInterval {
				if err := h.report(ctx); err != nil && ctx.Err() == nil {
					logger.Error(err, "node status")
				} else {
					lastStatus = time.Now()
				}
			}
			if time.Since(lastGC) >= h.GCInterval {
				if err := h.collect(ctx); err != nil && ctx.Err() == nil {
					logger.Error(err, "collecting orphan VMs")
				} else {
					lastGC = time.Now()
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (h *Heartbeat) renew(ctx context.Context) error {
	now := metav1.NowMicro()
	secs := int32(h.LeaseDuration / time.Second)
	if secs < 1 {
		secs = 1
	}
	key := types.NamespacedName{Namespace: h.Namespace, Name: zv1.LeaseName(h.Node)}
	var l coordinationv1.Lease
	err := h.APIReader.Get(ctx, key, &l)
	if apierrors.IsNotFound(err) {
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{"zygote.dev/node": h.Node}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &h.Node, LeaseDurationSeconds: &secs,
				AcquireTime: &now, RenewTime: &now},
		}
		return h.Client.Create(ctx, &l)
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &h.Node, &secs, &now
	return h.Client.Update(ctx, &l)
}

// report refreshes the ZygoteNode (made if missing), writing only what changed.
func (h *Heartbeat) report(ctx context.Context) error {
	info, err := h.Daemon.Info(ctx)
	if err != nil {
		return err
	}
	images, err := h.Daemon.Images(ctx)
	if err != nil {
		return err
	}
	snaps, err := h.Daemon.Snapshots(ctx)
	if err != nil {
		return err
	}
	vms, err := h.Daemon.List(ctx, nil)
	if err != nil {
		return err
	}
	var used zv1.NodeCapacity
	var count int32
	for _, vm := range vms {
		if vm.Metadata[zv1.DaemonKeyUID] == "" || vm.State == "dead" {
			continue
		}
		count++
		used.MemoryMiB += int64(vm.MemMiB)
		used.VCPUs += vm.VCPUs
	}
	runtimes := []string{info.Runtime.Name}
	sort.Strings(images)
	sort.Strings(snaps)
	cap := h.capacity()
	var n zv1.ZygoteNode
	err = h.APIReader.Get(ctx, types.NamespacedName{Name: h.Node}, &n)
	if apierrors.IsNotFound(err) {
		n = zv1.ZygoteNode{ObjectMeta: metav1.ObjectMeta{Name: h.Node}}
		if err := h.Client.Create(ctx, &n); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		if err := h.APIReader.Get(ctx, types.NamespacedName{Name: h.Node}, &n); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	want := n.Status.DeepCopy()
	want.DaemonURL, want.DaemonVersion, want.Runtime, want.Runtimes = h.AdvertiseURL, info.Version, info.Runtime.Name, runtimes
	want.Capacity, want.Allocated, want.Sandboxes = &cap, &used, count
	want.Images, want.Snapshots, want.LeaseName = images, snaps, zv1.LeaseName(h.Node)
	if meta.FindStatusCondition(want.Conditions, zv1.ConditionReady) == nil {
		meta.SetStatusCondition(&want.Conditions, metav1.Condition{Type: zv1.ConditionReady,
			Status: metav1.ConditionUnknown, Reason: "Starting", Message: "the controller has not judged the Lease yet"})
	}
	if equalNodeStatus(&n.Status, want) {
		return nil
	}
	n.Status = *want
	err = h.Client.Status().Update(ctx, &n)
	if apierrors.IsConflict(err) {
		return nil // the controller wrote Ready; next round
	}
	return err
}

func equalNodeStatus(a, b *zv1.ZygoteNodeStatus) bool {
	eqCap := func(x, y *zv1.NodeCapacity) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.DaemonURL == b.DaemonURL && a.DaemonVersion == b.DaemonVersion && a.Runtime == b.Runtime &&
		strings.Join(a.Runtimes, ",") == strings.Join(b.Runtimes, ",") && eqCap(a.Capacity, b.Capacity) &&
		eqCap(a.Allocated, b.Allocated) && a.Sandboxes == b.Sandboxes &&
		strings.Join(a.Images, ",") == strings.Join(b.Images, ",") &&
		strings.Join(a.Snapshots, ",") == strings.Join(b.Snapshots, ",") && a.LeaseName == b.LeaseName &&
		len(a.Conditions) == len(b.Conditions)
}

func (h *Heartbeat) capacity() zv1.NodeCapacity {
	c := h.Capacity
	if c.MemoryMiB == 0 {
		c.MemoryMiB = memTotalMiB() * 9 / 10
	}
	if c.VCPUs == 0 {
		c.VCPUs = int32(runtime.NumCPU())
	}
	return c
}

func memTotalMiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			return kib / 1024
		}
	}
	return 0
}

// collect deletes the daemon's Kubernetes-labelled VMs whose Sandbox no longer exists
// on this node (read from the API server, not a cache). VMs without the label were
// made by someone else on the daemon directly and are left alone.
func (h *Heartbeat) collect(ctx context.Context) error {
	vms, err := h.Daemon.List(ctx, nil)
	if err != nil {
		return err
	}
	labelled := false
	for _, vm := range vms {
		if vm.Metadata[zv1.DaemonKeyUID] != "" {
			labelled = true
		}
	}
	if !labelled {
		return nil
	}
	var list zv1.SandboxList
	if err := h.APIReader.List(ctx, &list, client.MatchingFieldsSelector{
		Selector: fields.OneTermEqualSelector("spec.nodeName", h.Node)}); err != nil {
		return err
	}
	live := map[string]bool{}
	for _, sb := range list.Items {
		live[string(sb.UID)] = true
	}
	for _, vm := range vms {
		uid := vm.Metadata[zv1.DaemonKeyUID]
		if uid == "" || live[uid] || vm.State == "deleting" {
			continue
		}
		// A VM made in the last seconds may belong to a Sandbox the list raced with.
		if time.Since(time.Unix(vm.CreatedAt, 0)) < 10*time.Second {
			continue
		}
		log.FromContext(ctx).Info("deleting a VM no Sandbox owns", "id", vm.ID, "uid", uid,
			"sandbox", vm.Metadata[zv1.DaemonKeyName])
		if err := h.Daemon.Delete(ctx, vm.ID); err != nil {
			return err
		}
	}
	return nil
}
