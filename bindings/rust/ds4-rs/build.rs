// An rpath to libds4's directory, so the command runs from a build tree without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_DS4_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
