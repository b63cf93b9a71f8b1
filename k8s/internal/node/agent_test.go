package node

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
)

// fakeDaemon is the part of zygoted's API the agent uses, in memory.
type fakeDaemon struct {
	mu      sync.Mutex
	vms     map[string]daemon.Sandbox
	creates int
	next    int
}

func (f *fakeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes":
		var out []daemon.Sandbox
		for _, vm := range f.vms {
			ok := true
			for _, kv := range r.URL.Query()["metadata"] {
				k, v, _ := strings.Cut(kv, "=")
				ok = ok && vm.Metadata[k] == v
			}
			if ok {
				out = append(out, vm)
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"sandboxes": out})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes":
		var req daemon.CreateRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.creates++
		f.next++
		vm := daemon.Sandbox{ID: "sb-" + string(rune('a'+f.next)), State: "running", Metadata: req.Metadata,
			MemMiB: req.MemMiB, VCPUs: req.VCPUs, CreatedAt: time.Now().Unix()}
		f.vms[vm.ID] = vm
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"sandboxes": []daemon.Sandbox{vm}})
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
		delete(f.vms, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, `{"error":{"code":"route_not_found","message":"no"}}`, http.StatusNotFound)
	}
}

func setup(t *testing.T, objs ...client.Object) (*Agent, *fakeDaemon, client.Client) {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = zv1.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&zv1.Sandbox{}).Build()
	fd := &fakeDaemon{vms: map[string]daemon.Sandbox{}}
	srv := httptest.NewServer(fd)
	t.Cleanup(srv.Close)
	a := &Agent{Client: c, APIReader: c, Daemon: daemon.New(srv.URL, "t"), AdvertiseURL: srv.URL,
		Node: "node-a", Resync: time.Second, MaxConcurrent: 1}
	return a, fd, c
}

func sandbox() *zv1.Sandbox {
	return &zv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: "s", UID: "uid-1"},
		Spec: zv1.SandboxSpec{SandboxParams: zv1.SandboxParams{Image: "minimal",
			Resources: &zv1.Resources{MemoryMiB: 128, VCPUs: 1}}, NodeName: "node-a"}}
}

func reconcile(t *testing.T, a *Agent) {
	t.Helper()
	if _, err := a.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "d", Name: "s"}}); err != nil {
		t.Fatal(err)
	}
}

func TestCreatesOnceLabelledAndAdoptsAfterRestart(t *testing.T) {
	a, fd, c := setup(t, sandbox())
	reconcile(t, a)
	reconcile(t, a) // a second pass (a resync, or a restarted agent) finds the VM by UID
	if fd.creates != 1 || len(fd.vms) != 1 {
		t.Fatalf("creates %d, VMs %d: want exactly one", fd.creates, len(fd.vms))
	}
	var sb zv1.Sandbox
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "d", Name: "s"}, &sb); err != nil {
		t.Fatal(err)
	}
	for _, vm := range fd.vms {
		if vm.Metadata[zv1.DaemonKeyUID] != "uid-1" || vm.Metadata[zv1.DaemonKeyName] != "d.s" || vm.MemMiB != 128 {
			t.Errorf("VM %+v", vm)
		}
		if sb.Status.SandboxID != vm.ID {
			t.Errorf("status id %q, VM %q", sb.Status.SandboxID, vm.ID)
		}
	}
	if sb.Status.Phase != zv1.PhaseRunning || sb.Status.Node != "node-a" || len(sb.Finalizers) != 1 {
		t.Errorf("status %+v finalizers %v", sb.Status, sb.Finalizers)
	}

	// A new agent (restart) with a lost status: it adopts, it does not create.
	sb.Status = zv1.SandboxStatus{}
	if err := c.Status().Update(context.Background(), &sb); err != nil {
		t.Fatal(err)
	}
	a2 := *a
	reconcile(t, &a2)
	if fd.creates != 1 {
		t.Fatalf("a restarted agent created again (%d creates)", fd.creates)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "d", Name: "s"}, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Status.Phase != zv1.PhaseRunning || sb.Status.Conditions[0].Reason != zv1.ReasonAdopted {
		t.Errorf("after adoption: %+v", sb.Status)
	}
}

func TestVMGoneIsFailedAndDeletionRemovesTheVM(t *testing.T) {
	a, fd, c := setup(t, sandbox())
	reconcile(t, a)
	fd.mu.Lock()
	fd.vms = map[string]daemon.Sandbox{} // deleted behind Kubernetes' back
	fd.mu.Unlock()
	reconcile(t, a)
	var sb zv1.Sandbox
	_ = c.Get(context.Background(), client.ObjectKey{Namespace: "d", Name: "s"}, &sb)
	if sb.Status.Phase != zv1.PhaseFailed || fd.creates != 1 {
		t.Fatalf("want Failed (VMGone) without a re-create: %+v, creates %d", sb.Status, fd.creates)
	}

	a2, fd2, c2 := setup(t, sandbox())
	reconcile(t, a2)
	if err := c2.Delete(context.Background(), sandbox()); err != nil {
		t.Fatal(err)
	}
	reconcile(t, a2)
	if len(fd2.vms) != 0 {
		t.Fatalf("VMs left after the Sandbox was deleted: %+v", fd2.vms)
	}
	if err := c2.Get(context.Background(), client.ObjectKey{Namespace: "d", Name: "s"}, &sb); err == nil {
		t.Fatalf("the Sandbox outlived its finalizer: %+v", sb.ObjectMeta)
	}
}

func TestIgnoresOtherNodesSandboxes(t *testing.T) {
	sb := sandbox()
	sb.Spec.NodeName = "node-b"
	a, fd, _ := setup(t, sb)
	reconcile(t, a)
	if fd.creates != 0 {
		t.Fatal("created a VM for another node's Sandbox")
	}
}
