//! The last step: the readback. Maps the workspace's readback buffer once the submission is
//! done, waits (bounded by the timeout, device loss reported), and copies the packed output words
//! out; also the cut-off readback the tests use.

use super::bindings::scoped;
use super::workspace::Workspace;
use super::GpuBackend;
use crate::error::Error;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Packed output words `[tokens | num_emitted | status]`.
pub(crate) type VerifyWords = Vec<u32>;

/// Set by the map callback: `Some(result)` once the readback is mapped (or failed).
pub(crate) type MapFlag = Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>;

/// The words of a small mappable `staging` buffer once `submission` (which copied them there)
/// is done, waiting at most `timeout`: the readback of the one-off diagnostic dispatches
/// (`rng_check`, the subgroup layout probe), which poll once instead of spinning.
pub(super) fn read_words(
    device: &wgpu::Device,
    staging: &wgpu::Buffer,
    submission: wgpu::SubmissionIndex,
    timeout: Duration,
) -> Result<Vec<u32>, Error> {
    let slice = staging.slice(..);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    // The map completes within the wait for the submission.
    device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(submission),
            timeout: Some(timeout),
        })
        .map_err(|_| Error::Timeout { waited: timeout })?;
    let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
        detail: format!("readback mapping: {e}"),
    })?;
    Ok(bytemuck::cast_slice::<u8, u32>(&view).to_vec())
}

/// Polls `device` without blocking until `ready` gives a value or `spin` has passed (`None`
/// then). Blocking reads call it before they sleep in the driver's wait, since waking from that
/// wait costs a small call more than its GPU time (`VerifierOptions::spin_wait`); the
/// benchmark's round-trip floor waits the same way, so that calls and floor are comparable.
pub(crate) fn spin_poll<T>(
    device: &wgpu::Device,
    spin: Duration,
    mut ready: impl FnMut() -> Result<Option<T>, Error>,
) -> Result<Option<T>, Error> {
    let start = std::time::Instant::now();
    while start.elapsed() < spin {
        let _ = device.poll(wgpu::PollType::Poll);
        if let Some(v) = ready()? {
            return Ok(Some(v));
        }
        std::hint::spin_loop();
    }
    Ok(None)
}

impl GpuBackend {
    /// Queues the copy of the packed output (`words` words) into the readback buffer.
    pub(super) fn record_readback_copy(
        encoder: &mut wgpu::CommandEncoder,
        ws: &Workspace,
        words: usize,
    ) {
        encoder.copy_buffer_to_buffer(ws.out.get(), 0, ws.readback.get(), 0, (words * 4) as u64);
    }

    /// Starts mapping the readback of a recorded verification; the returned flag is set by
    /// wgpu's callback once the copy has landed.
    pub(crate) fn start_map(&self, ws: &Workspace, words: usize) -> MapFlag {
        let flag: MapFlag = Arc::new(Mutex::new(None));
        if words > 0 {
            let flag_c = flag.clone();
            ws.readback.get().slice(..(words * 4) as u64).map_async(
                wgpu::MapMode::Read,
                move |r| {
                    *flag_c.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                },
            );
        } else {
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = Some(Ok(()));
        }
        flag
    }

    /// Blocks until `submission` is done (bounded by the timeout).
    pub(crate) fn wait(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<(), Error> {
        match self.kernels.device.poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: Some(self.timeout),
        }) {
            Ok(_) => self.check_alive(),
            Err(wgpu::PollError::Timeout) => Err(Error::Timeout {
                waited: self.timeout,
            }),
            Err(e) => Err(self.diagnose(e.to_string())),
        }
    }

    /// Waits for `submission`, then for the readback's map callback, and copies the words out.
    /// With several threads on one device, the thread whose poll completes our submission may
    /// run our callback a moment after our own wait returned, so the flag is polled (and the
    /// thread yields) until it is set, within the timeout.
    pub(crate) fn wait_for_map(
        &self,
        submission: Option<wgpu::SubmissionIndex>,
        ws: &Workspace,
        words: usize,
        flag: &MapFlag,
    ) -> Result<VerifyWords, Error> {
        let start = std::time::Instant::now();
        let spin = self.spin_wait.min(self.timeout);
        if let Some(w) = spin_poll(&self.kernels.device, spin, || self.collect(ws, words, flag))? {
            return Ok(w);
        }
        self.wait(submission)?;
        self.poll_until(start, || self.collect(ws, words, flag))
    }

    /// After a wait that saw the submission done: `ready`'s value, polling the device (and
    /// yielding) until it gives one, or `Error::Timeout` once the call's timeout has passed
    /// since `start`. With several threads on one device, the thread whose poll completed the
    /// submission may run a map callback a moment after the waiting thread's wait returned.
    fn poll_until<T>(
        &self,
        start: std::time::Instant,
        mut ready: impl FnMut() -> Result<Option<T>, Error>,
    ) -> Result<T, Error> {
        loop {
            if let Some(v) = ready()? {
                return Ok(v);
            }
            if start.elapsed() > self.timeout {
                return Err(Error::Timeout {
                    waited: self.timeout,
                });
            }
            self.poll_once()?;
            std::thread::yield_now();
        }
    }

    /// One non-blocking poll, for the async path.
    pub(crate) fn poll_once(&self) -> Result<(), Error> {
        let _ = self.kernels.device.poll(wgpu::PollType::Poll);
        self.check_alive()
    }

    /// The call's timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long a blocking read polls before it sleeps (`VerifierOptions::spin_wait`).
    pub(crate) fn spin_wait(&self) -> Duration {
        self.spin_wait
    }

    /// Copies the mapped readback out once `flag` is set. `Ok(None)` while still pending.
    pub(crate) fn collect(
        &self,
        ws: &Workspace,
        words: usize,
        flag: &MapFlag,
    ) -> Result<Option<VerifyWords>, Error> {
        let state = flag.lock().unwrap_or_else(|p| p.into_inner()).take();
        match state {
            None => return Ok(None),
            Some(Err(e)) => {
                self.check_alive()?;
                return Err(Error::Gpu {
                    detail: format!("readback failed: {e}"),
                });
            }
            Some(Ok(())) => {}
        }
        if words == 0 {
            return Ok(Some(Vec::new()));
        }
        let slice = ws.readback.get().slice(..(words * 4) as u64);
        let out = {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu {
                detail: format!("readback mapping: {e}"),
            })?;
            bytemuck::cast_slice::<u8, u32>(&view).to_vec()
        };
        ws.readback.get().unmap();
        if self.kernels.owns_device && self.kernels.uncaptured.swap(false, Ordering::SeqCst) {
            return Err(Error::Gpu {
                detail: "an uncaptured wgpu error was reported during the call".into(),
            });
        }
        Ok(Some(out))
    }

    /// The output buffer of a workspace (packed words) — for callers that keep results on the GPU.
    pub(crate) fn output_buffer(ws: &Workspace) -> &wgpu::Buffer {
        ws.out.get()
    }

    /// Reads back the first `n` cut-offs the last verification in `ws` left (test hook; blocks).
    pub(crate) fn read_cutoffs(&self, ws: &Workspace, n: usize) -> Result<Vec<f32>, Error> {
        self.read_floats(ws.cutoffs.get(), n)
    }

    /// Reads back the first `n` tree values the last tree verification in `ws` left (3 per slot:
    /// the child's logit and draft value at its parent's row, the mass of its test; test hook).
    pub(crate) fn read_tree_values(&self, ws: &Workspace, n: usize) -> Result<Vec<f32>, Error> {
        self.read_floats(ws.masses.get(), n)
    }

    /// Reads back the first `n` f32 of `src` (test hooks; blocks).
    fn read_floats(&self, src: &wgpu::Buffer, n: usize) -> Result<Vec<f32>, Error> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = (n * 4) as u64;
        let read = scoped(&self.kernels.device, || {
            let read = self.kernels.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("specdec.test_read"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder =
                self.kernels
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("specdec.test_read"),
                    });
            encoder.copy_buffer_to_buffer(src, 0, &read, 0, bytes);
            self.kernels.queue.submit([encoder.finish()]);
            read
        })
        .map_err(|e| self.lift(e))?;
        let flag: MapFlag = Arc::new(Mutex::new(None));
        let flag_c = flag.clone();
        read.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            *flag_c.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        let start = std::time::Instant::now();
        self.wait(None)?;
        // As in `wait_for_map`: another thread's poll may run our callback after our wait.
        self.poll_until(start, || {
            match flag.lock().unwrap_or_else(|p| p.into_inner()).take() {
                None => Ok(None),
                Some(Ok(())) => Ok(Some(())),
                Some(Err(e)) => Err(Error::Gpu {
                    detail: format!("test readback failed: {e}"),
                }),
            }
        })?;
        let out =
            bytemuck::cast_slice::<u8, f32>(&read.slice(..).get_mapped_range().map_err(|e| {
                Error::Gpu {
                    detail: format!("test readback mapping: {e}"),
                }
            })?)
            .to_vec();
        Ok(out)
    }
}
