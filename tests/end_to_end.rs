//! Not a test: the line a plain `cargo test` (the fast loop: unit tests and the tests that need
//! no bed) prints to say how to run the end-to-end tests, which it leaves out. They need the
//! test bed and are built only with the feature `e2e`; `scripts/test` turns it on and brings up
//! the bed. With the feature on, this prints nothing.
fn main() {
    if !cfg!(feature = "e2e") {
        println!(
            "end-to-end tests not run (they need the test bed): `bash scripts/test` runs every test; see docs/testing.md"
        );
    }
}
