//! The bound on requests in flight (k8s.io/apiserver's `WithMaxInFlightLimit`):
//! `--max-requests-inflight` read-only and `--max-mutating-requests-inflight` mutating requests
//! at once; past them a request is answered 429 `Too many requests, please try again later.`
//! with `Retry-After: 1`, which client-go and kubectl wait for and retry. Watches (long-running)
//! are not counted, `system:masters` is never refused (a super-user always gets an answer), and
//! the probes never come here.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use prometheus_client::metrics::{family::Family, gauge::Gauge};

use crate::{
    error::Error,
    observe::metrics::{InflightLabels, Metrics},
};

/// The limits (0: none), kube-apiserver's defaults.
#[derive(Debug, Clone, Copy)]
pub struct InflightLimits {
    /// `--max-requests-inflight`: get and list.
    pub read_only: usize,
    /// `--max-mutating-requests-inflight`: every other verb.
    pub mutating: usize,
}

impl Default for InflightLimits {
    fn default() -> Self {
        Self {
            read_only: 400,
            mutating: 200,
        }
    }
}

/// One kind of request's count.
#[derive(Debug, Default)]
struct Limiter {
    limit: usize,
    current: AtomicUsize,
}

impl Limiter {
    fn enter(&self) -> Result<(), Error> {
        let before = self.current.fetch_add(1, Ordering::AcqRel);
        if self.limit > 0 && before >= self.limit {
            self.current.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::TooManyRequests);
        }
        Ok(())
    }

    fn leave(&self) {
        self.current.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Both counts.
#[derive(Debug)]
pub struct Inflight {
    read_only: Limiter,
    mutating: Limiter,
    gauges: Family<InflightLabels, Gauge>,
}

impl Inflight {
    /// Reported in `metrics`' `apiserver_current_inflight_requests`.
    pub fn new(limits: InflightLimits, metrics: &Metrics) -> Self {
        Self {
            read_only: Limiter {
                limit: limits.read_only,
                ..Default::default()
            },
            mutating: Limiter {
                limit: limits.mutating,
                ..Default::default()
            },
            gauges: metrics.inflight.clone(),
        }
    }

    /// The limiter that counts a request of `verb` by a user in `system:masters` or not; None
    /// when it is not counted.
    fn limiter(&self, verb: &str, masters: bool) -> Option<&Limiter> {
        if masters || verb == "watch" {
            return None;
        }
        Some(match verb {
            "get" | "list" => &self.read_only,
            _ => &self.mutating,
        })
    }

    /// A place for a request of `verb` (as [`crate::request_info::RequestInfo`] names it)
    /// while the caller answers it at once (or for longer, [`Slot::into_owned`]); the 429 when
    /// there is none.
    pub fn admit(&self, verb: &str, masters: bool) -> Result<Slot<'_>, Error> {
        match self.limiter(verb, masters) {
            Some(limiter) => limiter.enter().map(|()| Slot(Some(limiter))),
            None => Ok(Slot(None)),
        }
    }

    /// [`Inflight::admit`] for a request that is answered later (its place may go with a
    /// streamed body).
    pub fn admit_owned(
        self: &Arc<Self>,
        verb: &str,
        masters: bool,
    ) -> Result<Option<OwnedSlot>, Error> {
        let Some(limiter) = self.limiter(verb, masters) else {
            return Ok(None);
        };
        limiter.enter()?;
        Ok(Some(OwnedSlot {
            inflight: self.clone(),
            mutating: std::ptr::eq(limiter, &self.mutating),
        }))
    }

    /// The counts into `apiserver_current_inflight_requests` (read when scraped).
    pub fn report(&self) {
        for (kind, limiter) in [("readOnly", &self.read_only), ("mutating", &self.mutating)] {
            let now = limiter.current.load(Ordering::Acquire);
            self.gauges
                .get_or_create(&InflightLabels { request_kind: kind })
                .set(i64::try_from(now).unwrap_or(i64::MAX));
        }
    }
}

/// A request answered at once, counted until this is dropped or kept ([`Slot::into_owned`]).
#[derive(Debug)]
pub struct Slot<'a>(Option<&'a Limiter>);

impl Slot<'_> {
    /// This place, kept past the call after all (a request whose answer turned out to need
    /// a future).
    /// `inflight` is the one that gave the place.
    pub fn into_owned(self, inflight: &Arc<Inflight>) -> Option<OwnedSlot> {
        let limiter = std::mem::ManuallyDrop::new(self).0?;
        debug_assert!(
            std::ptr::eq(limiter, &inflight.read_only) || std::ptr::eq(limiter, &inflight.mutating)
        );
        Some(OwnedSlot {
            inflight: inflight.clone(),
            mutating: std::ptr::eq(limiter, &inflight.mutating),
        })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(limiter) = self.0 {
            limiter.leave();
        }
    }
}

/// A request counted until this is dropped (with its response, or with its streamed body).
#[derive(Debug)]
pub struct OwnedSlot {
    inflight: Arc<Inflight>,
    mutating: bool,
}

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        match self.mutating {
            true => self.inflight.mutating.leave(),
            false => self.inflight.read_only.leave(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_as_kube_apiserver_counts_them() {
        let metrics = Metrics::new(&["zebras"]);
        let inflight = Inflight::new(
            InflightLimits {
                read_only: 1,
                mutating: 0,
            },
            &metrics,
        );
        let held = inflight.admit("get", false).unwrap();
        assert!(matches!(
            inflight.admit("list", false),
            Err(Error::TooManyRequests)
        ));
        // Watches and system:masters are not counted; 0 is no limit.
        assert!(inflight.admit("watch", false).is_ok());
        assert!(inflight.admit("get", true).is_ok());
        let writes: Vec<_> = (0..1000)
            .map(|_| inflight.admit("create", false).unwrap())
            .collect();
        inflight.report();
        let gauge = |kind| {
            metrics
                .inflight
                .get_or_create(&InflightLabels { request_kind: kind })
                .get()
        };
        assert_eq!((gauge("readOnly"), gauge("mutating")), (1, 1000));
        drop((held, writes));
        assert!(inflight.admit("get", false).is_ok());
        inflight.report();
        assert_eq!((gauge("readOnly"), gauge("mutating")), (0, 0));
    }

    #[test]
    fn a_place_kept_past_the_call_is_given_back_once() {
        let metrics = Metrics::new(&["zebras"]);
        let inflight = Arc::new(Inflight::new(
            InflightLimits {
                read_only: 1,
                mutating: 1,
            },
            &metrics,
        ));
        let kept = inflight.admit("get", false).unwrap().into_owned(&inflight);
        assert!(kept.is_some());
        assert!(inflight.admit("get", false).is_err(), "still held");
        assert!(inflight.admit("create", false).is_ok(), "a read's place");
        drop(kept);
        assert_eq!(inflight.read_only.current.load(Ordering::Acquire), 0);
        assert!(inflight.admit("get", false).is_ok());
        // A request not counted has no place to keep.
        assert!(
            inflight
                .admit("get", true)
                .unwrap()
                .into_owned(&inflight)
                .is_none()
        );
        assert_eq!(inflight.read_only.current.load(Ordering::Acquire), 0);
    }
}
