//! Integration tests: the real `cotald` binary and its bundled nats-server on loopback, with
//! random ports and temporary data dirs. One test binary, modules by area.

mod acl;
mod appliance;
mod backup;
mod bench;
mod certificate;
mod cli;
mod client;
mod cluster;
mod connection;
mod dashboard;
mod durable;
mod fairness;
mod faults;
mod health;
mod helper;
mod layering;
mod leaf;
mod mcp;
mod packaging;
mod pages;
mod raw;
mod receipts;
mod soak;
mod space;
mod upgrade;
mod wake;
mod wire;
