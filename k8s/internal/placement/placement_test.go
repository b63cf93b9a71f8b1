package placement

import (
	"strings"
	"testing"
)

func node(name string, mem, used int64) Node {
	return Node{Name: name, Ready: true, MemoryMiB: mem, VCPUs: 8, UsedMemoryMiB: used,
		Images: map[string]bool{}, Snapshots: map[string]bool{}}
}

func TestSpreadsByFreeMemory(t *testing.T) {
	nodes := []Node{node("a", 1024, 512), node("b", 1024, 0), node("c", 1024, 256)}
	d := Place(Request{MemoryMiB: 256, VCPUs: 1, Image: "minimal"}, nodes)
	if d.Node != "b" || d.Reason != Placed {
		t.Fatalf("want b, got %+v", d)
	}
}

func TestImageLocalityWinsOverFreeMemory(t *testing.T) {
	nodes := []Node{node("a", 1024, 512), node("b", 1024, 0)}
	nodes[0].Images["python:3.12"] = true
	d := Place(Request{MemoryMiB: 256, VCPUs: 1, Image: "python:3.12"}, nodes)
	if d.Node != "a" || !strings.Contains(d.Message, "cached") {
		t.Fatalf("want a (image cached), got %+v", d)
	}
}

func TestSnapshotOnlyOnHolder(t *testing.T) {
	nodes := []Node{node("a", 1024, 0), node("b", 1024, 0)}
	nodes[1].Snapshots["snap-1"] = true
	if d := Place(Request{MemoryMiB: 256, VCPUs: 1, Snapshot: "snap-1"}, nodes); d.Node != "b" {
		t.Fatalf("want b, got %+v", d)
	}
	d := Place(Request{MemoryMiB: 256, VCPUs: 1, Snapshot: "snap-2"}, nodes)
	if d.Node != "" || d.Reason != SnapshotNotFound {
		t.Fatalf("want SnapshotNotFound, got %+v", d)
	}
	nodes[1].UsedMemoryMiB = 1000
	d = Place(Request{MemoryMiB: 256, VCPUs: 1, Snapshot: "snap-1"}, nodes)
	if d.Node != "" || d.Reason != Unschedulable || !strings.Contains(d.Message, "b: 24 MiB free") {
		t.Fatalf("want Unschedulable naming b, got %+v", d)
	}
}

func TestBranchStaysOnParentNode(t *testing.T) {
	nodes := []Node{node("a", 1024, 768), node("b", 4096, 0)}
	d := Place(Request{MemoryMiB: 256, VCPUs: 1, ParentNode: "a"}, nodes)
	if d.Node != "a" {
		t.Fatalf("want a, got %+v", d)
	}
	d = Place(Request{MemoryMiB: 512, VCPUs: 2, ParentNode: "a"}, nodes)
	if d.Node != "" || d.Reason != ParentNodeFull || !strings.Contains(d.Message, "256 MiB free < 512 MiB") {
		t.Fatalf("want ParentNodeFull, got %+v", d)
	}
	nodes[0].Ready = false
	if d := Place(Request{MemoryMiB: 256, VCPUs: 1, ParentNode: "a"}, nodes); d.Reason != ParentNotReady {
		t.Fatalf("want ParentNotReady, got %+v", d)
	}
	if d := Place(Request{MemoryMiB: 256, VCPUs: 1, ParentNode: "zz"}, nodes); d.Reason != ParentNotReady {
		t.Fatalf("want ParentNotReady for an unknown node, got %+v", d)
	}
}

func TestSkipsNotReadyCordonedAndFull(t *testing.T) {
	nodes := []Node{node("a", 1024, 0), node("b", 1024, 0), node("c", 1024, 900), node("d", 1024, 0)}
	nodes[0].Ready = false
	nodes[1].Unschedulable = true
	nodes[3].VCPUs = 0
	d := Place(Request{MemoryMiB: 256, VCPUs: 1, Image: "minimal"}, nodes)
	if d.Node != "" || d.Reason != Unschedulable {
		t.Fatalf("want Unschedulable, got %+v", d)
	}
	for _, want := range []string{"0/4 nodes", "a: not ready", "b: unschedulable", "c: 124 MiB free < 256 MiB", "d: 0 vCPUs free < 1"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("message %q lacks %q", d.Message, want)
		}
	}
	if d := Place(Request{MemoryMiB: 256, VCPUs: 1}, nil); d.Reason != Unschedulable || !strings.Contains(d.Message, "no nodes") {
		t.Fatalf("no nodes: %+v", d)
	}
}

func TestTieBreaksByName(t *testing.T) {
	nodes := []Node{node("c", 1024, 0), node("a", 1024, 0), node("b", 1024, 0)}
	if d := Place(Request{MemoryMiB: 256, VCPUs: 1}, nodes); d.Node != "a" {
		t.Fatalf("want a, got %+v", d)
	}
}
