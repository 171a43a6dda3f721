//! Bounded input from a remote API server: a tower layer on its client that counts the bytes of
//! each response body as they arrive, and fails the body once it passes a limit, so that no
//! response (a list page, a Get) is held beyond `max_response` bytes and no watch event (one
//! line of a watch response) beyond `max_line`. Without it, kube buffers a list page whole, and
//! a watch line until its newline, however large: one hostile server could fill the memory of
//! the one process that serves every remote.
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use tower::{Layer, Service};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The limits of every response of one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyLimits {
    /// bytes of one whole response other than a watch (a list page, a Get)
    pub max_response: u64,
    /// bytes of one line of a watch response (one event's JSON)
    pub max_line: u64,
}

impl BodyLimits {
    /// No limits: the local cluster's client.
    pub const NONE: BodyLimits = BodyLimits {
        max_response: u64::MAX,
        max_line: u64::MAX,
    };
}

/// The defaults: a list page is at most 500 objects (`pages::PAGE`); an object in etcd is at
/// most 1.5 MiB.
impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            max_response: 32 << 20,
            max_line: 4 << 20,
        }
    }
}

/// Why a response was cut off.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TooLarge {
    #[error(
        "the response is larger than {limit} bytes (--max-response-bytes): refused, nothing more of it is read"
    )]
    Response { limit: u64 },
    #[error(
        "a watch event is longer than {limit} bytes (--max-watch-line-bytes): refused, nothing more of it is read"
    )]
    Line { limit: u64 },
}

/// What one body is counted as.
#[derive(Clone, Copy, Debug)]
enum Count {
    /// every byte: a response read whole
    Whole,
    /// the bytes since the last newline: a watch, read line by line
    Lines,
}

/// The body of a response, failing once it passes its limit.
pub struct Limited<B> {
    inner: B,
    count: Count,
    limit: u64,
    seen: u64,
    failed: bool,
}

impl<B> Limited<B> {
    fn new(inner: B, watch: bool, limits: BodyLimits) -> Self {
        let (count, limit) = if watch {
            (Count::Lines, limits.max_line)
        } else {
            (Count::Whole, limits.max_response)
        };
        Self {
            inner,
            count,
            limit,
            seen: 0,
            failed: false,
        }
    }

    /// Counts a chunk; Err once past the limit.
    fn take(&mut self, data: &[u8]) -> Result<(), TooLarge> {
        let len = data.len() as u64;
        match self.count {
            Count::Whole => {
                self.seen = self.seen.saturating_add(len);
                if self.seen > self.limit {
                    return Err(TooLarge::Response { limit: self.limit });
                }
            }
            Count::Lines => {
                // every line of the chunk: the first continues the previous chunk's last
                let mut lines = data.split(|b| *b == b'\n');
                let mut longest = self.seen + lines.next().map_or(0, |l| l.len() as u64);
                let mut last = longest;
                for l in lines {
                    last = l.len() as u64;
                    longest = longest.max(last);
                }
                self.seen = last;
                if longest > self.limit {
                    return Err(TooLarge::Line { limit: self.limit });
                }
            }
        }
        Ok(())
    }
}

impl<B> Body for Limited<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(e) = this.take(data)
                {
                    this.failed = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// True for a watch request (`?watch=true`, or `=1`).
fn is_watch(uri: &Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

/// The layer of a remote's client.
#[derive(Clone, Copy, Debug)]
pub struct LimitLayer(pub BodyLimits);

impl<S> Layer<S> for LimitLayer {
    type Service = LimitService<S>;

    fn layer(&self, inner: S) -> LimitService<S> {
        LimitService {
            inner,
            limits: self.0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LimitService<S> {
    inner: S,
    limits: BodyLimits,
}

type Pinned<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, Q, B> Service<Request<Q>> for LimitService<S>
where
    S: Service<Request<Q>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Limited<B>>;
    type Error = S::Error;
    type Future = Pinned<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Q>) -> Self::Future {
        let watch = is_watch(req.uri());
        let limits = self.limits;
        let response = self.inner.call(req);
        Box::pin(async move {
            let r = response.await?;
            Ok(r.map(|b| Limited::new(b, watch, limits)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A body of the given chunks.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    const LIMITS: BodyLimits = BodyLimits {
        max_response: 10,
        max_line: 4,
    };

    /// Reads the body to its end: the bytes, or the error it ended with.
    fn read(chunks: &[&str], watch: bool) -> Result<Vec<u8>, String> {
        let body = Chunks(chunks.iter().map(|c| Bytes::from(c.to_string())).collect());
        let mut limited = Limited::new(body, watch, LIMITS);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        loop {
            match Pin::new(&mut limited).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => out.extend_from_slice(f.data_ref().unwrap()),
                Poll::Ready(Some(Err(e))) => {
                    // nothing more is read after the error
                    assert!(limited.is_end_stream());
                    return Err(e.to_string());
                }
                Poll::Ready(None) => return Ok(out),
                Poll::Pending => unreachable!("the test body is always ready"),
            }
        }
    }

    #[test]
    fn a_response_up_to_its_limit_passes_and_one_byte_more_fails() {
        assert_eq!(read(&["01234", "56789"], false).unwrap(), b"0123456789");
        let e = read(&["01234", "56789", "x", "never read"], false).unwrap_err();
        assert!(
            e.contains("larger than 10 bytes (--max-response-bytes)"),
            "{e}"
        );
    }

    #[test]
    fn a_watch_counts_each_line_across_chunks() {
        // many short lines make a long response: fine
        let ok = read(&["abc\nabcd\n", "ab", "cd\na", "bc\n"], true).unwrap();
        assert_eq!(ok, b"abc\nabcd\nabcd\nabc\n");
        // a line continued over chunks
        let e = read(&["ab", "cd", "e\n"], true).unwrap_err();
        assert!(
            e.contains("longer than 4 bytes (--max-watch-line-bytes)"),
            "{e}"
        );
        // a long line in the middle of a chunk
        assert!(read(&["a\nabcdef\nb\n"], true).is_err());
        // a long first line of a chunk after a newline ended the previous one
        assert!(read(&["abcd\n", "abcde"], true).is_err());
    }

    #[test]
    fn a_watch_is_known_by_its_query() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert!(is_watch(&uri(
            "/api/v1/services?labelSelector=a&watch=true"
        )));
        assert!(is_watch(&uri("/api/v1/services?watch=1")));
        assert!(!is_watch(&uri("/api/v1/services?limit=500")));
        assert!(!is_watch(&uri(
            "/api/v1/services?labelSelector=watch%3Dtrue"
        )));
        assert!(!is_watch(&uri("/api/v1/services")));
    }
}
