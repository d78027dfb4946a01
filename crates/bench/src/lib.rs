//! Measurement harnesses shared by `virtnet bench` and the criterion benches.
