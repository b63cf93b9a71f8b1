//! Developer shortcut: boot an image and run shell snippets in it, printing
//! each one's output and result. `cargo run -p zygote-qemu --example sh -- IMAGE 'SCRIPT'...`
fn main() {
    let mut args = std::env::args().skip(1);
    let image = args.next().unwrap_or_else(|| "minimal".into());
    let cfg = zygote_qemu::QemuConfig::for_image(&image, &mut |l| eprintln!("  {l}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let vm = zygote_qemu::QemuVm::boot(&cfg).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("booted in {:?}", vm.boot_duration());
    for script in args {
        let out = vm
            .client()
            .exec_output(zygote_proto::ExecRequest::shell(script.clone()))
            .unwrap_or_else(|e| panic!("{e}"));
        println!("$ {script}");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        println!("=> {:?}", out.result);
    }
}
