package pool

import (
	"reflect"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func m(name, phase string, age int, placed bool) Member {
	return Member{Name: name, Phase: phase, Placed: placed, Created: t0.Add(-time.Duration(age) * time.Second)}
}

func TestFillsAnEmptyPool(t *testing.T) {
	p := PlanPool(3, nil)
	if p.Create != 3 || len(p.Delete) != 0 {
		t.Fatalf("%+v", p)
	}
}

func TestReplacesLostAndFailedAndIgnoresDeleting(t *testing.T) {
	deleting := m("d", "Running", 5, true)
	deleting.Deleting = true
	p := PlanPool(3, []Member{
		m("a", "Running", 10, true), m("b", "Lost", 10, true), m("c", "Failed", 3, true), deleting,
	})
	if p.Create != 2 || !reflect.DeepEqual(p.Delete, []string{"b", "c"}) || p.Active != 1 || p.Ready != 1 {
		t.Fatalf("%+v", p)
	}
}

func TestKeepsAFullPool(t *testing.T) {
	p := PlanPool(2, []Member{m("a", "Running", 10, true), m("b", "Creating", 1, true)})
	if p.Create != 0 || len(p.Delete) != 0 || p.Active != 2 || p.Ready != 1 {
		t.Fatalf("%+v", p)
	}
}

func TestScaleDownDropsLeastAdvancedFirst(t *testing.T) {
	p := PlanPool(1, []Member{
		m("old-running", "Running", 30, true), m("new-running", "Running", 5, true),
		m("creating", "Creating", 8, true), m("unplaced", "Pending", 20, false),
	})
	want := []string{"unplaced", "creating", "new-running"}
	if !reflect.DeepEqual(p.Delete, want) || p.Active != 1 || p.Ready != 1 {
		t.Fatalf("got %+v, want delete %v", p, want)
	}
}

func TestClaimTakesOldestRunning(t *testing.T) {
	deleting := m("x", "Running", 100, true)
	deleting.Deleting = true
	got := ClaimOrder([]Member{
		m("young", "Running", 1, true), m("creating", "Creating", 50, true), deleting,
		m("old", "Running", 40, true),
	})
	if !reflect.DeepEqual(got, []string{"old", "young"}) {
		t.Fatalf("%v", got)
	}
}
