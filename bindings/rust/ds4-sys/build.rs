// Finds libds4: DS4_LIB_DIR (set by CMake/ctest to the build's lib/), else pkg-config's
// libdir for ds4, else the linker's default paths. The directory is passed on to dependent
// build scripts as DEP_DS4_LIBDIR so they can set an rpath for their binaries.
use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DS4_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let dir = env::var("DS4_LIB_DIR").ok().filter(|d| !d.is_empty()).or_else(|| {
        let out = Command::new("pkg-config").args(["--variable=libdir", "ds4"]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
        if s.is_empty() {
            None
        } else {
            Some(s)
        }
    });
    if let Some(d) = dir {
        println!("cargo:rustc-link-search=native={}", d);
        println!("cargo:libdir={}", d);
    }
    println!("cargo:rustc-link-lib=dylib=ds4");
}
