//! Diagnostics beside the verification pipeline: the rng_check kernel (Philox words and noise
//! for given counters, compared with the CPU twin by the tests) and the read-bandwidth kernel
//! (the memory roofline `bench` reports). Neither touches a workspace.

use super::bindings::{entry, layout_entry, scoped, storage};
use super::GpuBackend;
use crate::error::Error;
use crate::layout::*;
use crate::shaders::Kernel;

/// rng_check's bindings: the counters and the key it reads, the words it writes.
pub(super) fn rng_check_layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    vec![
        layout_entry(0, storage(true)),
        layout_entry(1, storage(true)),
        layout_entry(2, storage(false)),
    ]
}

/// read_bandwidth's bindings: the data it reads, the sink it writes.
pub(super) fn read_bandwidth_layout_entries() -> Vec<wgpu::BindGroupLayoutEntry> {
    vec![
        layout_entry(0, storage(true)),
        layout_entry(1, storage(false)),
    ]
}

impl GpuBackend {
    /// Records the read-bandwidth kernel over all of `data` (a multiple of 16 bytes) with
    /// `workgroups` workgroups, optionally timed.
    pub(crate) fn record_read_bandwidth(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        data: &wgpu::Buffer,
        sink: &wgpu::Buffer,
        workgroups: u32,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        self.record_read_chain(encoder, data, sink, workgroups, 1, timestamps);
    }

    /// Records one compute pass of `dispatches` read-bandwidth dispatches in a row, each of
    /// `workgroups` workgroups, optionally timed. Every dispatch binds `sink` read-write, so wgpu
    /// orders each after the one before with a barrier, as it orders the verifier's dependent
    /// dispatches: over a tiny `data` the pass times the cost of a chain of dispatches itself
    /// (`bench`'s dispatch-chain floor).
    pub(crate) fn record_read_chain(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        data: &wgpu::Buffer,
        sink: &wgpu::Buffer,
        workgroups: u32,
        dispatches: u32,
        timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        let group = self
            .kernels
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("specdec.read_bandwidth"),
                layout: &self.kernels.layouts[&Kernel::ReadBandwidth],
                entries: &[entry(0, data), entry(1, sink)],
            });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("specdec.read_bandwidth"),
            timestamp_writes: timestamps,
        });
        pass.set_pipeline(self.pipeline(Kernel::ReadBandwidth, "main"));
        pass.set_bind_group(0, &group, &[]);
        for _ in 0..dispatches {
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
    }

    /// Runs the rng_check kernel: for each counter (quad, pos_lo, stream, pos_hi) under `seed`,
    /// 12 words: Philox words, uniform bits, Exp(1) bits.
    pub(crate) fn rng_check(&self, seed: u64, counters: &[[u32; 4]]) -> Result<Vec<u32>, Error> {
        use wgpu::util::DeviceExt;
        let dev = &self.kernels.device;
        let req = ReqInfo {
            seed_lo: seed as u32,
            seed_hi: (seed >> 32) as u32,
            ..ReqInfo::default()
        };
        let bytes = (counters.len() * 48) as u64;
        let counters_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("specdec.rng_check.counters"),
            contents: bytemuck::cast_slice(counters),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let req_buf = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("specdec.rng_check.key"),
            contents: bytemuck::bytes_of(&req),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.rng_check.out"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("specdec.rng_check.read"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let index = scoped(dev, || {
            let group = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("specdec.rng_check"),
                layout: &self.kernels.layouts[&Kernel::RngCheck],
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: counters_buf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: req_buf.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: out.as_entire_binding(),
                    },
                ],
            });
            let mut encoder = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("specdec.rng_check"),
            });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                });
                pass.set_pipeline(self.pipeline(Kernel::RngCheck, "main"));
                pass.set_bind_group(0, &group, &[]);
                pass.dispatch_workgroups(
                    counters.len().div_ceil(self.kernels.wg as usize) as u32,
                    1,
                    1,
                );
            }
            encoder.copy_buffer_to_buffer(&out, 0, &read, 0, bytes);
            self.kernels.queue.submit([encoder.finish()])
        })?;
        super::readback::read_words(&self.kernels.device, &read, index, self.timeout)
    }
}
