//! A response body played step by step (data, pauses, a failure): what a
//! scripted upstream answers with, as an LLM API streams.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;

/// One step of a scripted response body.
pub enum Step {
    Data(Bytes),
    Pause(u64),
    Fail,
}

/// A response body played step by step.
pub struct Scripted {
    pub steps: VecDeque<Step>,
    pub sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        loop {
            if let Some(sleep) = &mut self.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.steps.pop_front() {
                None => return Poll::Ready(None),
                Some(Step::Data(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                Some(Step::Pause(ms)) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
                }
                Some(Step::Fail) => return Poll::Ready(Some(Err(std::io::Error::other("cut")))),
            }
        }
    }
}

impl Scripted {
    pub fn new(steps: VecDeque<Step>) -> Scripted {
        Scripted { steps, sleep: None }
    }
}
