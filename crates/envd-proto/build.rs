//! Generates envd's Connect-RPC code (buffa messages + connectrpc service
//! traits and clients) with the vendored `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    connectrpc_build::Config::new()
        .files(&["proto/process.proto", "proto/filesystem.proto"])
        .includes(&["proto/".into(), include])
        .include_file("_connectrpc.rs")
        .compile()?;
    Ok(())
}
