package controller

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	zv1 "zygote.dev/k8s/api/v1alpha1"
)

func lease(renew time.Time, secs int32) *coordinationv1.Lease {
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: zv1.LeaseName("n")},
		Spec: coordinationv1.LeaseSpec{RenewTime: &t, LeaseDurationSeconds: &secs}}
}

func TestNodeStateFromLease(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	h := &NodeHealth{Grace: 5 * time.Second, Now: func() time.Time { return now }}
	node := &zv1.ZygoteNode{}
	if st := h.state("n", node, lease(now.Add(-time.Second), 10)); !st.Ready || st.Lost {
		t.Fatalf("fresh lease: %+v", st)
	}
	if st := h.state("n", node, lease(now.Add(-12*time.Second), 10)); st.Ready || st.Lost ||
		!strings.Contains(st.Why, "expired") {
		t.Fatalf("expired within grace: %+v", st)
	}
	st := h.state("n", node, lease(now.Add(-16*time.Second), 10))
	if st.Ready || !st.Lost || !strings.Contains(st.Why, "stopped renewing its Lease zygote-node-n") ||
		!strings.Contains(st.Why, "grace 5s") {
		t.Fatalf("expired past grace: %+v", st)
	}
	if st := h.state("n", node, nil); st.Ready || st.Lost {
		t.Fatalf("a node without a Lease yet is neither ready nor lost: %+v", st)
	}
	if st := h.state("n", nil, nil); !st.Lost || !strings.Contains(st.Why, "does not exist") {
		t.Fatalf("an unknown node is lost: %+v", st)
	}
}

func TestUsageCountsPlacedLiveSandboxesAndBranches(t *testing.T) {
	mk := func(name, node string, mem int32, phase zv1.SandboxPhase) zv1.Sandbox {
		sb := zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: name, UID: ktypes.UID("u-" + name)}}
		sb.Spec.Image = "minimal"
		sb.Spec.Resources = &zv1.Resources{MemoryMiB: mem, VCPUs: 1}
		sb.Spec.NodeName = node
		sb.Status.Phase = phase
		return sb
	}
	parent := mk("p", "a", 512, zv1.PhaseRunning)
	kids := zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: "k", UID: "u-k"}}
	kids.Spec.BranchFrom = &zv1.BranchFrom{Sandbox: "p", Count: 3}
	kids.Spec.NodeName = "a"
	used, seen := usage([]zv1.Sandbox{
		parent, kids,
		mk("lost", "b", 256, zv1.PhaseLost),
		mk("b1", "b", 256, zv1.PhaseCreating),
		mk("unplaced", "", 256, zv1.PhasePending),
	})
	if used["a"] != [2]int64{512 + 3*512, 4} {
		t.Errorf("node a: %v (parent 512 + 3 children of 512)", used["a"])
	}
	if used["b"] != [2]int64{256, 1} {
		t.Errorf("node b: %v (a Lost Sandbox holds nothing)", used["b"])
	}
	if len(seen) != 4 || seen["u-unplaced"] {
		t.Errorf("seen: %v", seen)
	}
}

func TestAssumptionsLastUntilTheCacheCatchesUp(t *testing.T) {
	var a assumed
	a.add("placed", assumption{node: "a", memMiB: 256, createdAt: time.Now()})
	a.add("lagging", assumption{node: "a", memMiB: 512, createdAt: time.Now()})
	a.add("deleted", assumption{node: "b", memMiB: 1024, createdAt: time.Now()})
	a.add("stale", assumption{node: "c", memMiB: 64, createdAt: time.Now().Add(-2 * time.Minute)})
	present := map[ktypes.UID]bool{"placed": true, "lagging": true, "stale": true}
	got := a.pending(map[ktypes.UID]bool{"placed": true}, present)
	if len(got) != 1 || got[0].memMiB != 512 {
		t.Fatalf("want only the lagging one, got %+v", got)
	}
	if len(a.m) != 1 {
		t.Fatalf("the others are forgotten: %+v", a.m)
	}
}
