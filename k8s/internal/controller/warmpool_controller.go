package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/pool"
)

// WarmPoolReconciler keeps each SandboxWarmPool at spec.replicas ready Sandboxes.
type WarmPoolReconciler struct {
	client.Client
	// expect: Sandboxes this controller created that the cache may not show yet, per
	// pool (so a quick second reconcile does not create them again).
	mu     sync.Mutex
	expect map[types.UID]map[string]time.Time
}

func (r *WarmPoolReconciler) expected(pool types.UID, seen map[string]bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for name, at := range r.expect[pool] {
		if seen[name] || time.Since(at) > time.Minute {
			delete(r.expect[pool], name)
			continue
		}
		n++
	}
	return n
}

func (r *WarmPoolReconciler) expectCreated(pool types.UID, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.expect == nil {
		r.expect = map[types.UID]map[string]time.Time{}
	}
	if r.expect[pool] == nil {
		r.expect[pool] = map[string]time.Time{}
	}
	r.expect[pool][name] = time.Now()
}

// poolMembers lists the Sandboxes a pool controls (by label and owner UID).
func poolMembers(ctx context.Context, c client.Reader, p *zv1.SandboxWarmPool) ([]zv1.Sandbox, error) {
	var list zv1.SandboxList
	if err := c.List(ctx, &list, client.InNamespace(p.Namespace),
		client.MatchingLabels{zv1.LabelPool: p.Name}); err != nil {
		return nil, err
	}
	var out []zv1.Sandbox
	for _, sb := range list.Items {
		if ref := metav1.GetControllerOf(&sb); ref != nil && ref.UID == p.UID {
			out = append(out, sb)
		}
	}
	return out, nil
}

func asMembers(sbs []zv1.Sandbox) []pool.Member {
	out := make([]pool.Member, len(sbs))
	for i, sb := range sbs {
		out[i] = pool.Member{Name: sb.Name, Phase: string(sb.Status.Phase),
			Deleting: !sb.DeletionTimestamp.IsZero(), Placed: sb.Spec.NodeName != "",
			Created: sb.CreationTimestamp.Time}
	}
	return out
}

// newSandbox is a Sandbox of template t, controlled by owner.
func newSandbox(t *zv1.SandboxTemplate, owner client.Object, ownerKind string, name, generateName string,
	labels map[string]string) *zv1.Sandbox {
	sb := &zv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: t.Namespace, Name: name, GenerateName: generateName, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owner,
				zv1.GroupVersion.WithKind(ownerKind))},
		},
		Spec: zv1.SandboxSpec{SandboxParams: *t.Spec.SandboxParams.DeepCopy()},
	}
	sb.Labels[zv1.LabelTemplate] = t.Name
	return sb
}

// Reconcile one pool.
func (r *WarmPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var p zv1.SandboxWarmPool
	if err := r.Get(ctx, req.NamespacedName, &p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	members, err := poolMembers(ctx, r.Client, &p)
	if err != nil {
		return ctrl.Result{}, err
	}
	seen := map[string]bool{}
	for _, m := range members {
		seen[m.Name] = true
	}
	ms := asMembers(members)
	for i := 0; i < r.expected(p.UID, seen); i++ {
		ms = append(ms, pool.Member{Name: fmt.Sprintf("(creating %d)", i), Created: time.Now()})
	}
	plan := pool.PlanPool(int(p.Spec.Replicas), ms)
	logger := log.FromContext(ctx)
	for _, name := range plan.Delete {
		if name[0] == '(' {
			continue
		}
		sb := &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name}}
		if err := r.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		logger.Info("deleted pool member", "sandbox", name)
	}
	var tmpl zv1.SandboxTemplate
	cond := metav1.Condition{Type: zv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Full",
		Message: fmt.Sprintf("%d/%d ready", plan.Ready, p.Spec.Replicas)}
	requeue := time.Duration(0)
	if plan.Create > 0 {
		err := r.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.SandboxTemplateRef.Name}, &tmpl)
		if client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		if err != nil {
			cond = metav1.Condition{Type: zv1.ConditionReady, Status: metav1.ConditionFalse,
				Reason: zv1.ReasonTemplateNotFound, Message: "SandboxTemplate " +
					p.Spec.SandboxTemplateRef.Name + " does not exist"}
			requeue = 10 * time.Second
		} else {
			for i := 0; i < plan.Create; i++ {
				sb := newSandbox(&tmpl, &p, "SandboxWarmPool", "", p.Name+"-",
					map[string]string{zv1.LabelPool: p.Name})
				if err := r.Create(ctx, sb); err != nil {
					return ctrl.Result{}, err
				}
				r.expectCreated(p.UID, sb.Name)
				plan.Active++
				logger.Info("created pool member", "sandbox", sb.Name)
			}
		}
	}
	if cond.Status == metav1.ConditionTrue && int32(plan.Ready) < p.Spec.Replicas {
		cond.Status, cond.Reason = metav1.ConditionFalse, "Filling"
	}
	want := p.Status.DeepCopy()
	want.Replicas, want.ReadyReplicas = int32(plan.Active), int32(plan.Ready)
	want.Selector = zv1.LabelPool + "=" + p.Name
	meta.SetStatusCondition(&want.Conditions, cond)
	if !statusEqual(&p.Status, want) {
		p.Status = *want
		if err := r.Status().Update(ctx, &p); err != nil {
			return ctrl.Result{}, ignoreConflict(client.IgnoreNotFound(err))
		}
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

func statusEqual(a, b *zv1.SandboxWarmPoolStatus) bool {
	if a.Replicas != b.Replicas || a.ReadyReplicas != b.ReadyReplicas || a.Selector != b.Selector ||
		len(a.Conditions) != len(b.Conditions) {
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

// byLabel maps a Sandbox to the object its label names (on updates, controller-runtime
// calls it for the old and the new object, so a claimed Sandbox that left a pool still
// wakes the pool up).
func byLabel(label string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if v := o.GetLabels()[label]; v != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: v}}}
		}
		return nil
	})
}

// SetupWithManager registers the reconciler.
func (r *WarmPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&zv1.SandboxWarmPool{}).
		Watches(&zv1.Sandbox{}, byLabel(zv1.LabelPool)).
		Named("warmpool").
		Complete(r)
}
