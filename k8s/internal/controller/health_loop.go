package controller

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	zv1 "zygote.dev/k8s/api/v1alpha1"
)

// NodeWatcher periodically judges every node by its Lease: it keeps each ZygoteNode's
// Ready condition, and marks the Sandboxes of a node lost longer than the grace period
// Lost (a terminal phase: pools replace them, claims report them).
type NodeWatcher struct {
	Client   client.Client
	Health   *NodeHealth
	Interval time.Duration
}

// Start runs until ctx ends (a manager Runnable, so only the leader runs it).
func (w *NodeWatcher) Start(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		if err := w.sweep(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "node sweep")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: yes, one controller writes Lost.
func (w *NodeWatcher) NeedLeaderElection() bool { return true }

func (w *NodeWatcher) sweep(ctx context.Context) error {
	states, nodes, err := w.Health.nodeStates(ctx, w.Client)
	if err != nil {
		return err
	}
	for name, n := range nodes {
		st := states[name]
		want := metav1.Condition{Type: zv1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: "LeaseRenewed", Message: "the node agent renews its Lease"}
		if !st.Ready {
			want = metav1.Condition{Type: zv1.ConditionReady, Status: metav1.ConditionUnknown,
				Reason: "LeaseExpired", Message: st.Why}
			if st.Lost {
				want.Reason = zv1.ReasonNodeLost
			}
		}
		c := meta.FindStatusCondition(n.Status.Conditions, zv1.ConditionReady)
		if c == nil || c.Status != want.Status || c.Reason != want.Reason {
			meta.SetStatusCondition(&n.Status.Conditions, want)
			if err := w.Client.Status().Update(ctx, n); ignoreConflict(client.IgnoreNotFound(err)) != nil {
				return err
			}
		}
	}
	var all zv1.SandboxList
	if err := w.Client.List(ctx, &all); err != nil {
		return err
	}
	for i := range all.Items {
		sb := &all.Items[i]
		if sb.Spec.NodeName == "" || sb.Status.Phase.Terminal() || !sb.DeletionTimestamp.IsZero() {
			continue
		}
		st, ok := states[sb.Spec.NodeName]
		if !ok {
			st = w.Health.state(sb.Spec.NodeName, nil, nil)
		}
		if !st.Lost {
			continue
		}
		sb.Status.Phase = zv1.PhaseLost
		meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: zv1.ConditionReady,
			Status: metav1.ConditionFalse, Reason: zv1.ReasonNodeLost, Message: st.Why,
			ObservedGeneration: sb.Generation})
		if err := w.Client.Status().Update(ctx, sb); ignoreConflict(client.IgnoreNotFound(err)) != nil {
			return err
		}
		log.FromContext(ctx).Info("marked Lost", "sandbox", sb.Namespace+"/"+sb.Name, "why", st.Why)
	}
	return nil
}
