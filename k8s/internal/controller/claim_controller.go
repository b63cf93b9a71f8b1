package controller

import (
	"context"
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/pool"
)

// ClaimReconciler binds each SandboxClaim to a Sandbox: a ready one taken from a warm
// pool of its template in the same reconcile when there is one, else a new one.
type ClaimReconciler struct {
	client.Client
}

// Reconcile one claim.
func (r *ClaimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var c zv1.SandboxClaim
	if err := r.Get(ctx, req.NamespacedName, &c); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if c.Status.Sandbox != nil {
		return ctrl.Result{}, r.mirror(ctx, &c)
	}
	// A Sandbox this claim already owns (bound before a status write was lost, or before
	// a controller restart) is bound again, never a second one.
	var owned zv1.SandboxList
	if err := r.List(ctx, &owned, client.InNamespace(c.Namespace),
		client.MatchingLabels{zv1.LabelClaim: c.Name}); err != nil {
		return ctrl.Result{}, err
	}
	for i := range owned.Items {
		if ref := metav1.GetControllerOf(&owned.Items[i]); ref != nil && ref.UID == c.UID {
			return ctrl.Result{}, r.bound(ctx, &c, &owned.Items[i], zv1.ReasonAdopted,
				"re-bound Sandbox "+owned.Items[i].Name+" this claim already owned")
		}
	}
	if sb, from, err := r.takeWarm(ctx, &c); err != nil || sb != nil {
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.bound(ctx, &c, sb, zv1.ReasonFromWarmPool,
			fmt.Sprintf("bound ready Sandbox %s from warm pool %s", sb.Name, from))
	}
	var tmpl zv1.SandboxTemplate
	err := r.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.SandboxTemplateRef.Name}, &tmpl)
	if client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	if err != nil {
		c.Status.Phase = zv1.ClaimPending
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: zv1.ConditionBound,
			Status: metav1.ConditionFalse, Reason: zv1.ReasonTemplateNotFound,
			Message: "SandboxTemplate " + c.Spec.SandboxTemplateRef.Name + " does not exist"})
		return ctrl.Result{RequeueAfter: 10 * time.Second}, ignoreConflict(r.Status().Update(ctx, &c))
	}
	// Named after the claim: a retry finds it instead of making another.
	sb := newSandbox(&tmpl, &c, "SandboxClaim", c.Name, "", map[string]string{zv1.LabelClaim: c.Name})
	if err := r.Create(ctx, sb); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return ctrl.Result{}, err
		}
		if err := r.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
			return ctrl.Result{}, err
		}
		if ref := metav1.GetControllerOf(sb); ref == nil || ref.UID != c.UID {
			return ctrl.Result{}, r.failed(ctx, &c, "SandboxNameTaken",
				"a Sandbox named "+c.Name+" exists and belongs to something else")
		}
	}
	log.FromContext(ctx).Info("no warm Sandbox: created one", "sandbox", sb.Name)
	return ctrl.Result{}, r.bound(ctx, &c, sb, zv1.ReasonCreatedForClaim,
		"no ready Sandbox in a warm pool of template "+tmpl.Name+": created "+sb.Name)
}

// takeWarm moves the oldest ready member of a matching pool to the claim: pool label
// off, claim label on, controller reference from the pool to the claim, in one update
// whose resourceVersion makes two claims racing for one Sandbox end with one winner.
func (r *ClaimReconciler) takeWarm(ctx context.Context, c *zv1.SandboxClaim) (*zv1.Sandbox, string, error) {
	var pools zv1.SandboxWarmPoolList
	if err := r.List(ctx, &pools, client.InNamespace(c.Namespace)); err != nil {
		return nil, "", err
	}
	sort.Slice(pools.Items, func(i, j int) bool { return pools.Items[i].Name < pools.Items[j].Name })
	for i := range pools.Items {
		p := &pools.Items[i]
		if p.Spec.SandboxTemplateRef.Name != c.Spec.SandboxTemplateRef.Name ||
			(c.Spec.WarmPool != "" && c.Spec.WarmPool != p.Name) || !p.DeletionTimestamp.IsZero() {
			continue
		}
		members, err := poolMembers(ctx, r.Client, p)
		if err != nil {
			return nil, "", err
		}
		byName := map[string]*zv1.Sandbox{}
		for j := range members {
			byName[members[j].Name] = &members[j]
		}
		for _, name := range pool.ClaimOrder(asMembers(members)) {
			sb := byName[name]
			delete(sb.Labels, zv1.LabelPool)
			sb.Labels[zv1.LabelClaim] = c.Name
			refs := []metav1.OwnerReference{*metav1.NewControllerRef(c, zv1.GroupVersion.WithKind("SandboxClaim"))}
			for _, ref := range sb.OwnerReferences {
				if ref.UID != p.UID {
					refs = append(refs, ref)
				}
			}
			sb.OwnerReferences = refs
			if err := r.Update(ctx, sb); err != nil {
				if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
					continue // another claim (or a deletion) got it first
				}
				return nil, "", err
			}
			return sb, p.Name, nil
		}
	}
	return nil, "", nil
}

func claimPhase(p zv1.SandboxPhase) zv1.ClaimPhase {
	switch p {
	case zv1.PhaseRunning:
		return zv1.ClaimBound
	case zv1.PhaseLost:
		return zv1.ClaimLost
	case zv1.PhaseFailed, zv1.PhaseExpired:
		return zv1.ClaimFailed
	}
	return zv1.ClaimPending
}

func (r *ClaimReconciler) bound(ctx context.Context, c *zv1.SandboxClaim, sb *zv1.Sandbox, reason, msg string) error {
	now := metav1.Now()
	c.Status.Sandbox = &zv1.SandboxRef{Name: sb.Name}
	c.Status.BoundAt = &now
	c.Status.Phase = claimPhase(sb.Status.Phase)
	c.Status.Node, c.Status.SandboxID, c.Status.Endpoints = sb.Spec.NodeName, sb.Status.SandboxID, sb.Status.Endpoints
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: zv1.ConditionBound,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: c.Generation})
	return r.Status().Update(ctx, c)
}

func (r *ClaimReconciler) failed(ctx context.Context, c *zv1.SandboxClaim, reason, msg string) error {
	c.Status.Phase = zv1.ClaimFailed
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: zv1.ConditionBound,
		Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: c.Generation})
	return ignoreConflict(r.Status().Update(ctx, c))
}

// mirror copies the bound Sandbox's state to the claim.
func (r *ClaimReconciler) mirror(ctx context.Context, c *zv1.SandboxClaim) error {
	var sb zv1.Sandbox
	err := r.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Status.Sandbox.Name}, &sb)
	if client.IgnoreNotFound(err) != nil {
		return err
	}
	if err != nil {
		if c.Status.Phase == zv1.ClaimFailed {
			return nil
		}
		return r.failed(ctx, c, zv1.ReasonSandboxGone, "its Sandbox "+c.Status.Sandbox.Name+" was deleted")
	}
	want := claimPhase(sb.Status.Phase)
	node, id := sb.Spec.NodeName, sb.Status.SandboxID
	if c.Status.Phase == want && c.Status.Node == node && c.Status.SandboxID == id &&
		(c.Status.Endpoints == nil) == (sb.Status.Endpoints == nil) {
		return nil
	}
	c.Status.Phase, c.Status.Node, c.Status.SandboxID, c.Status.Endpoints = want, node, id, sb.Status.Endpoints
	return ignoreConflict(r.Status().Update(ctx, c))
}

// SetupWithManager registers the reconciler.
func (r *ClaimReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&zv1.SandboxClaim{}).
		Watches(&zv1.Sandbox{}, byLabel(zv1.LabelClaim)).
		Named("claim").
		Complete(r)
}
