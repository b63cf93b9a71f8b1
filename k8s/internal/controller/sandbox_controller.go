// Package controller is zygote's cluster controller: it places Sandboxes on nodes,
// keeps warm pools full, binds claims, and marks the Sandboxes of lost nodes Lost. It
// never talks to a daemon: each node's agent (internal/node) is the single writer of
// its host's VMs.
package controller

import (
	"context"
	"fmt"
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
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/placement"
)

// SandboxReconciler places unplaced Sandboxes, deletes Sandboxes whose pool or claim is
// gone, and releases the finalizer of deleted Sandboxes whose node is lost.
type SandboxReconciler struct {
	client.Client
	// APIReader reads past the cache (to confirm an owner is really gone).
	APIReader client.Reader
	Health    *NodeHealth
	assumed   assumed
}

// +kubebuilder:rbac:groups=zygote.dev,resources=sandboxes;sandboxclaims;sandboxwarmpools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=zygote.dev,resources=sandboxes/status;sandboxclaims/status;sandboxwarmpools/status;zygotenodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=zygote.dev,resources=sandboxes/finalizers,verbs=update
// +kubebuilder:rbac:groups=zygote.dev,resources=sandboxtemplates;zygotenodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile one Sandbox.
func (r *SandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb zv1.Sandbox
	if err := r.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		if err := r.releaseIfNodeLost(ctx, &sb); err != nil {
			return ctrl.Result{}, err
		}
		if controllerutil.ContainsFinalizer(&sb, zv1.FinalizerVM) {
			// Its node agent removes the VM; look again in case the node is lost first.
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return ctrl.Result{}, nil
	}
	if gone, err := r.ownerGone(ctx, &sb); err != nil || gone {
		return ctrl.Result{}, err
	}
	if sb.Spec.NodeName != "" || sb.Status.Phase.Terminal() {
		return ctrl.Result{}, nil
	}
	return r.place(ctx, &sb)
}

// releaseIfNodeLost removes the VM finalizer of a deleted Sandbox that no node agent
// will ever clean up (never placed, or its node is lost). A lost node's agent deletes
// such VMs itself when it comes back (they carry a UID no Sandbox has).
func (r *SandboxReconciler) releaseIfNodeLost(ctx context.Context, sb *zv1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(sb, zv1.FinalizerVM) {
		return nil
	}
	if sb.Spec.NodeName != "" {
		st, err := r.Health.stateOf(ctx, r.Client, sb.Spec.NodeName)
		if err != nil || !st.Lost {
			return err
		}
	}
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(sb, zv1.FinalizerVM)
	log.FromContext(ctx).Info("released the finalizer of a Sandbox whose node is lost", "node", sb.Spec.NodeName)
	return client.IgnoreNotFound(r.Patch(ctx, sb, patch))
}

// ownerGone deletes a Sandbox whose controlling pool or claim no longer exists (what
// the garbage collector does in a full cluster; checked against the API server, not
// the cache, so a Sandbox made by a brand-new owner is never mistaken for an orphan).
func (r *SandboxReconciler) ownerGone(ctx context.Context, sb *zv1.Sandbox) (bool, error) {
	ref := metav1.GetControllerOf(sb)
	if ref == nil || ref.APIVersion != zv1.GroupVersion.String() {
		return false, nil
	}
	var owner client.Object
	switch ref.Kind {
	case "SandboxWarmPool":
		owner = &zv1.SandboxWarmPool{}
	case "SandboxClaim":
		owner = &zv1.SandboxClaim{}
	default:
		return false, nil
	}
	key := types.NamespacedName{Namespace: sb.Namespace, Name: ref.Name}
	err := r.APIReader.Get(ctx, key, owner)
	if err == nil && owner.GetUID() == ref.UID {
		return false, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return false, err
	}
	log.FromContext(ctx).Info("deleting a Sandbox whose owner is gone", "owner", ref.Kind+"/"+ref.Name)
	return true, client.IgnoreNotFound(r.Delete(ctx, sb))
}

func (r *SandboxReconciler) place(ctx context.Context, sb *zv1.Sandbox) (ctrl.Result, error) {
	states, nodes, err := r.Health.nodeStates(ctx, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	var all zv1.SandboxList
	if err := r.List(ctx, &all); err != nil {
		return ctrl.Result{}, err
	}
	used, seen := usage(all.Items)
	preq := placement.Request{
		MemoryMiB: int64(sb.Spec.MemoryMiB()) * int64(sb.Spec.Count()),
		VCPUs:     int64(sb.Spec.VCPUs()) * int64(sb.Spec.Count()),
		Image:     sb.Spec.Image,
		Snapshot:  sb.Spec.Snapshot,
	}
	if bf := sb.Spec.BranchFrom; bf != nil {
		var parent zv1.Sandbox
		err := r.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: bf.Sandbox}, &parent)
		if client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		if err != nil || parent.Spec.NodeName == "" || parent.Status.Phase != zv1.PhaseRunning {
			why := fmt.Sprintf("waiting for parent Sandbox %s to run", bf.Sandbox)
			if err != nil {
				why = fmt.Sprintf("parent Sandbox %s does not exist", bf.Sandbox)
			} else if parent.Status.Phase.Terminal() {
				why = fmt.Sprintf("parent Sandbox %s is %s", bf.Sandbox, parent.Status.Phase)
			}
			return ctrl.Result{RequeueAfter: 2 * time.Second},
				r.setUnscheduled(ctx, sb, zv1.ReasonWaitingForParent, why)
		}
		pm, pv := demand(&parent, 0, 0)
		pm /= int64(parent.Spec.Count())
		pv /= int64(parent.Spec.Count())
		preq.MemoryMiB, preq.VCPUs = pm*int64(bf.Count), pv*int64(bf.Count)
		if bf.Count == 0 {
			preq.MemoryMiB, preq.VCPUs = pm, pv
		}
		preq.ParentNode = parent.Spec.NodeName
	}
	present := map[types.UID]bool{}
	for i := range all.Items {
		present[all.Items[i].UID] = true
	}
	pnodes := placementNodes(states, nodes, used, r.assumed.pending(seen, present))
	d := placement.Place(preq, pnodes)
	if bf := sb.Spec.BranchFrom; d.Reason == placement.ParentNodeFull && bf.SnapshotPack != nil {
		// Move the branch point: the parent's node pushes it as a pack, another node
		// starts the children from it.
		moved := preq
		moved.ParentNode = ""
		if md := placement.Place(moved, pnodes); md.Node != "" {
			ref := bf.SnapshotPack.Repository + ":" + string(sb.UID)
			if err := r.requestPack(ctx, sb.Namespace, bf.Sandbox, sb.UID, ref); err != nil {
				return ctrl.Result{}, err
			}
			d = placement.Decision{Node: md.Node, Reason: zv1.ReasonMovedAsPack, Message: d.Message +
				"; moving the branch point instead: " + md.Message + ", from the snapshot pack " + ref}
		}
	}
	if d.Node == "" {
		return ctrl.Result{RequeueAfter: 3 * time.Second}, r.setUnscheduled(ctx, sb, d.Reason, d.Message)
	}
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	sb.Spec.NodeName = d.Node
	if err := r.Patch(ctx, sb, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.assumed.add(sb.UID, assumption{node: d.Node, memMiB: preq.MemoryMiB, vcpus: preq.VCPUs, createdAt: time.Now()})
	log.FromContext(ctx).Info("placed", "node", d.Node, "why", d.Message)
	// The node agent may be writing status already: retry on conflicts with the latest.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur zv1.Sandbox
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(sb), &cur); err != nil {
			return err
		}
		if cur.Status.Phase == "" {
			cur.Status.Phase = zv1.PhasePending
		}
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: zv1.ConditionScheduled,
			Status: metav1.ConditionTrue, Reason: d.Reason, Message: d.Message, ObservedGeneration: cur.Generation})
		return r.Status().Update(ctx, &cur)
	})
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	return ctrl.Result{}, nil
}

// requestPack asks the parent's node agent (through an annotation on the parent: the
// agent is the only writer of its host) to push the parent as a snapshot pack to ref.
func (r *SandboxReconciler) requestPack(ctx context.Context, ns, parent string, child types.UID, ref string) error {
	var p zv1.Sandbox
	if err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: parent}, &p); err != nil {
		return err
	}
	key := zv1.AnnotationPackPrefix + string(child)
	if p.Annotations[key] == ref {
		return nil
	}
	patch := client.MergeFrom(p.DeepCopy())
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[key] = ref
	return r.Patch(ctx, &p, patch)
}

// setUnscheduled records why a Sandbox is not placed (written only when it changes).
func (r *SandboxReconciler) setUnscheduled(ctx context.Context, sb *zv1.Sandbox, reason, msg string) error {
	c := meta.FindStatusCondition(sb.Status.Conditions, zv1.ConditionScheduled)
	if sb.Status.Phase == zv1.PhasePending && c != nil && c.Reason == reason && c.Message == msg {
		return nil
	}
	sb.Status.Phase = zv1.PhasePending
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: zv1.ConditionScheduled,
		Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: sb.Generation})
	return client.IgnoreNotFound(ignoreConflict(r.Status().Update(ctx, sb)))
}

func ignoreConflict(err error) error {
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// SetupWithManager registers the reconciler. Placement runs one Sandbox at a time, so
// each decision sees the ones before it.
func (r *SandboxReconciler) SetupWithManager(mgr ctrl.Manager) error {
	// A deleted pool or claim wakes its Sandboxes up, so they are deleted with it (what
	// the garbage collector does where kube-controller-manager runs).
	owned := func(label string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list zv1.SandboxList
			if err := r.List(ctx, &list, client.InNamespace(o.GetNamespace()),
				client.MatchingLabels{label: o.GetName()}); err != nil {
				return nil
			}
			out := make([]reconcile.Request, len(list.Items))
			for i := range list.Items {
				out[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
			}
			return out
		})
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&zv1.Sandbox{}).
		Watches(&zv1.SandboxClaim{}, owned(zv1.LabelClaim)).
		Watches(&zv1.SandboxWarmPool{}, owned(zv1.LabelPool)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Named("sandbox-placement").
		Complete(r)
}
