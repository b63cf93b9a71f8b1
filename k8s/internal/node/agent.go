// Package node is zygote's node agent: it runs beside one zygoted, reconciles the
// Sandboxes placed on its node through that daemon's REST API (the only writer of the
// host's VMs, like a kubelet), reports the node's capacity in its ZygoteNode and
// renews the node's Lease while the daemon answers.
package node

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
)

// Agent reconciles the Sandboxes of one node.
type Agent struct {
	// Client: the manager's client (its cache holds only this node's Sandboxes).
	Client client.Client
	// APIReader reads past the cache.
	APIReader client.Reader
	Daemon    *daemon.Client
	// AdvertiseURL: the daemon's URL as clients should reach it (status.endpoints).
	AdvertiseURL string
	Node         string
	// Resync: how often a running Sandbox's VM is looked at again.
	Resync time.Duration
	// MaxConcurrent VM creations.
	MaxConcurrent int
}

// Reconcile one Sandbox placed on this node.
func (a *Agent) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb zv1.Sandbox
	if err := a.Client.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if sb.Spec.NodeName != a.Node {
		return ctrl.Result{}, nil
	}
	if !sb.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, a.finalize(ctx, &sb)
	}
	vms, err := a.vmsOf(ctx, sb.UID)
	if err != nil {
		return a.daemonDown(ctx, &sb, err)
	}
	switch sb.Status.Phase {
	case zv1.PhaseLost:
		// Its node was given up for lost (pools replaced it): the VM must not linger.
		return ctrl.Result{}, a.deleteVMs(ctx, vms)
	case zv1.PhaseFailed, zv1.PhaseExpired:
		return ctrl.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(&sb, zv1.FinalizerVM) {
		patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&sb, zv1.FinalizerVM)
		if err := a.Client.Patch(ctx, &sb, patch); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil // changed meanwhile: look again
			}
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
	}
	if len(vms) > 0 {
		if err := a.observe(ctx, &sb, vms, false); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: a.Resync}, a.servePacks(ctx, &sb, vms[0])
	}
	if sb.Status.SandboxID != "" {
		// It ran here and its VM is gone: expired, or deleted behind Kubernetes' back.
		return ctrl.Result{}, a.vmGone(ctx, &sb)
	}
	return a.create(ctx, &sb)
}

// vmsOf lists the daemon's VMs labelled with a Sandbox's UID (the adoption key).
func (a *Agent) vmsOf(ctx context.Context, uid types.UID) ([]daemon.Sandbox, error) {
	vms, err := a.Daemon.List(ctx, map[string]string{zv1.DaemonKeyUID: string(uid)})
	if err != nil {
		return nil, err
	}
	var out []daemon.Sandbox
	for _, vm := range vms {
		if vm.State != "deleting" {
			out = append(out, vm)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt != out[j].CreatedAt {
			return out[i].CreatedAt < out[j].CreatedAt
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

func (a *Agent) deleteVMs(ctx context.Context, vms []daemon.Sandbox) error {
	for _, vm := range vms {
		if err := a.Daemon.Delete(ctx, vm.ID); err != nil {
			return err
		}
		log.FromContext(ctx).Info("deleted VM", "id", vm.ID)
	}
	return nil
}

// finalize deletes the VMs of a deleted Sandbox, then lets it go.
func (a *Agent) finalize(ctx context.Context, sb *zv1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(sb, zv1.FinalizerVM) {
		return nil
	}
	vms, err := a.vmsOf(ctx, sb.UID)
	if err != nil {
		return err
	}
	if err := a.deleteVMs(ctx, vms); err != nil {
		return err
	}
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(sb, zv1.FinalizerVM)
	return client.IgnoreNotFound(a.Client.Patch(ctx, sb, patch))
}

// updateStatus applies mutate to the latest Sandbox and writes its status, retrying on
// conflicts (the controller writes Scheduled and Lost).
func (a *Agent) updateStatus(ctx context.Context, key types.NamespacedName, mutate func(*zv1.Sandbox) bool) error {
	return client.IgnoreNotFound(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sb zv1.Sandbox
		if err := a.APIReader.Get(ctx, key, &sb); err != nil {
			return err
		}
		if sb.Status.Phase == zv1.PhaseLost || sb.Spec.NodeName != a.Node {
			return nil // the controller's verdict stands
		}
		if !mutate(&sb) {
			return nil
		}
		sb.Status.ObservedGeneration = sb.Generation
		return a.Client.Status().Update(ctx, &sb)
	}))
}

func setReady(sb *zv1.Sandbox, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: zv1.ConditionReady,
		Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation})
}

// observe writes what the daemon says about the Sandbox's VMs.
func (a *Agent) observe(ctx context.Context, sb *zv1.Sandbox, vms []daemon.Sandbox, fresh bool) error {
	ids := make([]string, len(vms))
	phase, reason, msg := zv1.PhaseRunning, zv1.ReasonRunning, "VM running on "+a.Node
	if !fresh && sb.Status.SandboxID == "" {
		reason, msg = zv1.ReasonAdopted, "adopted the VM that already ran on "+a.Node
	}
	var expires *metav1.Time
	for i, vm := range vms {
		ids[i] = vm.ID
		switch vm.State {
		case "dead":
			why := "no reason given"
			if vm.ExitReason != nil {
				why = *vm.ExitReason
			}
			phase, reason, msg = zv1.PhaseFailed, zv1.ReasonVMExited, fmt.Sprintf("VM %s exited: %s", vm.ID, why)
		case "creating":
			if phase == zv1.PhaseRunning {
				phase, reason, msg = zv1.PhaseCreating, zv1.ReasonCreating, "the daemon is starting VM "+vm.ID
			}
		}
		if vm.ExpiresAt != nil && expires == nil {
			t := metav1.NewTime(time.Unix(*vm.ExpiresAt, 0))
			expires = &t
		}
	}
	if n := int(sb.Spec.Count()); phase == zv1.PhaseRunning && len(vms) < n {
		msg = fmt.Sprintf("%d of %d branch children run", len(vms), n)
	}
	return a.updateStatus(ctx, client.ObjectKeyFromObject(sb), func(s *zv1.Sandbox) bool {
		st := &s.Status
		before := st.DeepCopy()
		st.Phase, st.Node, st.SandboxID, st.SandboxIDs = phase, a.Node, ids[0], ids
		st.Endpoints = &zv1.Endpoints{API: a.AdvertiseURL, Exec: a.AdvertiseURL + "/v1/sandboxes/" + ids[0] + "/exec"}
		st.MemoryMiB, st.VCPUs = vms[0].MemMiB, vms[0].VCPUs
		if st.StartedAt == nil && phase == zv1.PhaseRunning {
			t := metav1.NewTime(time.Unix(vms[0].CreatedAt, 0))
			st.StartedAt = &t
		}
		st.ExpiresAt = expires
		c := meta.FindStatusCondition(st.Conditions, zv1.ConditionReady)
		if c != nil && c.Status == metav1.ConditionTrue && phase == zv1.PhaseRunning {
			reason, msg = c.Reason, c.Message // keep how it came to run
		}
		ready := metav1.ConditionFalse
		if phase == zv1.PhaseRunning {
			ready = metav1.ConditionTrue
		}
		setReady(s, ready, reason, msg)
		return !equalStatus(before, st)
	})
}

func equalStatus(a, b *zv1.SandboxStatus) bool {
	if a.Phase != b.Phase || a.Node != b.Node || a.SandboxID != b.SandboxID ||
		strings.Join(a.SandboxIDs, ",") != strings.Join(b.SandboxIDs, ",") ||
		a.MemoryMiB != b.MemoryMiB || (a.StartedAt == nil) != (b.StartedAt == nil) ||
		(a.ExpiresAt == nil) != (b.ExpiresAt == nil) || (a.Endpoints == nil) != (b.Endpoints == nil) ||
		len(a.Conditions) != len(b.Conditions) {
		return false
	}
	if a.Endpoints != nil && *a.Endpoints != *b.Endpoints {
		return false
	}
	for i := range a.Conditions {
		x, y := a.Conditions[i], b.Conditions[i]
		if x.Type != y.Type || x.Status != y.Status || x.Reason != y.Reason || x.Message != y.Message {
			return false
		}
	}
	return true
}

func (a *Agent) vmGone(ctx context.Context, sb *zv1.Sandbox) error {
	return a.updateStatus(ctx, client.ObjectKeyFromObject(sb), func(s *zv1.Sandbox) bool {
		if s.Status.Phase.Terminal() {
			return false
		}
		if s.Status.ExpiresAt != nil && time.Now().After(s.Status.ExpiresAt.Add(-2*time.Second)) {
			s.Status.Phase = zv1.PhaseExpired
			setReady(s, metav1.ConditionFalse, zv1.ReasonTTLExpired,
				"its ttlSeconds ran out at "+s.Status.ExpiresAt.UTC().Format(time.RFC3339)+" and the daemon deleted the VM")
		} else {
			s.Status.Phase = zv1.PhaseFailed
			setReady(s, metav1.ConditionFalse, zv1.ReasonVMGone,
				"the daemon on "+a.Node+" no longer has VM "+s.Status.SandboxID)
		}
		return true
	})
}

// daemonDown: nothing can be done on this node until the daemon answers; the Lease
// stops being renewed meanwhile, so the controller judges the node.
func (a *Agent) daemonDown(ctx context.Context, sb *zv1.Sandbox, err error) (ctrl.Result, error) {
	log.FromContext(ctx).Info("daemon unavailable", "error", err.Error())
	return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
}

// create boots (or branches) the Sandbox's VM.
func (a *Agent) create(ctx context.Context, sb *zv1.Sandbox) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(sb)
	meta := map[string]string{zv1.DaemonKeyUID: string(sb.UID), zv1.DaemonKeyName: sb.Namespace + "." + sb.Name}
	var parentID string
	if bf := sb.Spec.BranchFrom; bf != nil {
		var parent zv1.Sandbox
		err := a.APIReader.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: bf.Sandbox}, &parent)
		switch {
		case apierrors.IsNotFound(err):
			return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonWaitingForParent, "parent Sandbox "+bf.Sandbox+" does not exist")
		case err != nil:
			return ctrl.Result{}, err
		case parent.Status.Phase != zv1.PhaseRunning || parent.Status.SandboxID == "":
			if parent.Status.Phase.Terminal() {
				return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonWaitingForParent,
					"parent Sandbox "+bf.Sandbox+" is "+string(parent.Status.Phase))
			}
			return ctrl.Result{RequeueAfter: time.Second}, nil
		case parent.Spec.NodeName != a.Node && bf.SnapshotPack == nil:
			return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonParentOnOtherNode,
				"parent Sandbox "+bf.Sandbox+" runs on "+parent.Spec.NodeName+", not "+a.Node)
		case parent.Spec.NodeName != a.Node:
			return a.createFromPack(ctx, sb, &parent, meta)
		}
		parentID = parent.Status.SandboxID
	}
	if err := a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
		s.Status.Phase, s.Status.Node = zv1.PhaseCreating, a.Node
		msg := "booting " + s.Spec.Image
		switch {
		case s.Spec.Snapshot != "":
			msg = "starting from snapshot " + s.Spec.Snapshot
		case s.Spec.BranchFrom != nil:
			msg = "branching " + parentID
		}
		setReady(s, metav1.ConditionFalse, zv1.ReasonCreating, msg)
		return true
	}); err != nil {
		return ctrl.Result{}, err
	}
	var vms []daemon.Sandbox
	var err error
	if parentID != "" {
		var br *daemon.BranchResponse
		br, err = a.Daemon.Branch(ctx, parentID, daemon.BranchRequest{
			Count: sb.Spec.Count(), TTLSecs: sb.Spec.TTLSeconds, Metadata: meta})
		if err == nil {
			vms, err = a.vmsOf(ctx, sb.UID)
			if err == nil && len(br.Failed) > 0 {
				log.FromContext(ctx).Info("some branch children failed", "failed", br.Failed)
			}
		}
	} else {
		r := daemon.CreateRequest{Image: sb.Spec.Image, Snapshot: sb.Spec.Snapshot,
			TTLSecs: sb.Spec.TTLSeconds, Envs: sb.Spec.Env, Metadata: meta}
		if sb.Spec.Image != "" {
			r.MemMiB, r.VCPUs = sb.Spec.MemoryMiB(), sb.Spec.VCPUs()
		}
		if n := sb.Spec.Network; n != nil {
			r.Network, r.AllowOut, r.DenyOut = n.Mode, n.AllowOut, n.DenyOut
		}
		vms, err = a.Daemon.Create(ctx, r)
	}
	if err != nil {
		if daemon.IsClientError(err) {
			return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonDaemonRefused, err.Error())
		}
		// The VM may exist (a timeout, a daemon restart): the next pass adopts it by UID.
		return ctrl.Result{RequeueAfter: 2 * time.Second}, a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
			setReady(s, metav1.ConditionFalse, zv1.ReasonDaemonUnavailable, err.Error())
			return true
		})
	}
	if len(vms) == 0 {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	log.FromContext(ctx).Info("VM running", "id", vms[0].ID, "count", len(vms))
	return ctrl.Result{RequeueAfter: a.Resync}, a.observe(ctx, sb, vms, true)
}

// createFromPack starts a moved branch's children from the snapshot pack the parent's
// node pushed (see servePacks), once it is there.
func (a *Agent) createFromPack(ctx context.Context, sb *zv1.Sandbox, parent *zv1.Sandbox,
	meta map[string]string) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(sb)
	ref := sb.Spec.BranchFrom.SnapshotPack.Repository + ":" + string(sb.UID)
	var pushed *zv1.PushedPack
	for i := range parent.Status.Packs {
		if parent.Status.Packs[i].Reference == ref {
			pushed = &parent.Status.Packs[i]
		}
	}
	if pushed == nil {
		msg := "waiting for " + parent.Spec.NodeName + " to push the branch point as " + ref
		return ctrl.Result{RequeueAfter: time.Second}, a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
			c := readyCondition(s)
			if s.Status.Phase == zv1.PhaseCreating && c != nil && c.Message == msg {
				return false
			}
			s.Status.Phase, s.Status.Node = zv1.PhaseCreating, a.Node
			setReady(s, metav1.ConditionFalse, zv1.ReasonWaitingForPack, msg)
			return true
		})
	}
	if pushed.Error != "" {
		return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonPackFailed, "pushing the branch point as "+ref+
			" failed on "+parent.Spec.NodeName+": "+pushed.Error)
	}
	if err := a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
		s.Status.Phase, s.Status.Node = zv1.PhaseCreating, a.Node
		setReady(s, metav1.ConditionFalse, zv1.ReasonCreating, "starting "+strconv.Itoa(int(sb.Spec.Count()))+
			" children from the snapshot pack "+ref+" ("+pushed.Digest+")")
		return true
	}); err != nil {
		return ctrl.Result{}, err
	}
	vms, err := a.Daemon.Create(ctx, daemon.CreateRequest{N: sb.Spec.Count(), Snapshot: ref,
		TTLSecs: sb.Spec.TTLSeconds, Metadata: meta})
	if err != nil {
		if daemon.IsClientError(err) {
			return ctrl.Result{}, a.fail(ctx, key, zv1.ReasonDaemonRefused, err.Error())
		}
		return ctrl.Result{RequeueAfter: 2 * time.Second}, a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
			setReady(s, metav1.ConditionFalse, zv1.ReasonDaemonUnavailable, err.Error())
			return true
		})
	}
	log.FromContext(ctx).Info("children started from a snapshot pack", "reference", ref, "count", len(vms))
	return ctrl.Result{RequeueAfter: a.Resync}, a.observe(ctx, sb, vms, true)
}

func readyCondition(s *zv1.Sandbox) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, zv1.ConditionReady)
}

// servePacks pushes the Sandbox as a snapshot pack for every moved branch the
// controller asked for (annotation pack.zygote.dev/<child UID>) and records the result
// in status.packs, where the child's node waits for it.
func (a *Agent) servePacks(ctx context.Context, sb *zv1.Sandbox, vm daemon.Sandbox) error {
	done := map[string]bool{}
	for _, p := range sb.Status.Packs {
		done[p.Reference] = true
	}
	for k, ref := range sb.Annotations {
		if !strings.HasPrefix(k, zv1.AnnotationPackPrefix) || done[ref] || vm.State != "running" {
			continue
		}
		result := zv1.PushedPack{Reference: ref}
		snap, err := a.Daemon.SnapshotFull(ctx, vm.ID)
		if err == nil {
			result.Digest, err = a.Daemon.PushSnapshot(ctx, snap, ref)
			// The pack is what travels; the local snapshot is not needed (refused while
			// the sandbox's disk still reads it: then it stays).
			_ = a.Daemon.DeleteSnapshot(ctx, snap)
		}
		if err != nil {
			if !daemon.IsClientError(err) && ctx.Err() != nil {
				return err
			}
			result.Error = err.Error()
		}
		log.FromContext(ctx).Info("pushed a branch point", "reference", ref, "digest", result.Digest, "error", result.Error)
		if err := a.updateStatus(ctx, client.ObjectKeyFromObject(sb), func(s *zv1.Sandbox) bool {
			for _, p := range s.Status.Packs {
				if p.Reference == ref {
					return false
				}
			}
			s.Status.Packs = append(s.Status.Packs, result)
			return true
		}); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) fail(ctx context.Context, key types.NamespacedName, reason, msg string) error {
	return a.updateStatus(ctx, key, func(s *zv1.Sandbox) bool {
		s.Status.Phase, s.Status.Node = zv1.PhaseFailed, a.Node
		setReady(s, metav1.ConditionFalse, reason, msg)
		return true
	})
}

// SetupWithManager registers the agent's reconciler.
func (a *Agent) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&zv1.Sandbox{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: a.MaxConcurrent, NeedLeaderElection: ptr(false)}).
		Named("node-agent").
		Complete(a)
}

func ptr[T any](v T) *T { return &v }
