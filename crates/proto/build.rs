//! Generates the scheduler's gRPC code with the vendored `protoc`, so no system
//! install is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/warren/scheduler/v1/scheduler.proto",
            "proto/warren/scheduler/v1/records.proto",
            "proto/warren/scheduler/v1/volumes.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
