//! `warren-chaos`: the failover experiment (work in progress).
