//! Least-squares fits for the soak: how many bytes of memory each message
//! retained, or each live event, adds.
//!
//! A slope is `None` when the points cannot determine it (fewer than two,
//! or no spread in x), never a division by zero.

fn mean(values: &[f64]) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "a handful of samples")]
    let n = values.len() as f64;
    values.iter().sum::<f64>() / n
}

/// Sum of `(a - mean a) * (b - mean b)`.
fn co_sum(a: &[f64], b: &[f64]) -> f64 {
    let (ma, mb) = (mean(a), mean(b));
    a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum()
}

/// The slope of the least-squares line through `(x, y)`.
pub fn slope(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 2 {
        return None;
    }
    let sxx = co_sum(x, x);
    // Relative to the data's scale: no spread at all gives no slope.
    if sxx <= f64::EPSILON * x.iter().map(|v| v * v).sum::<f64>() {
        return None;
    }
    Some(co_sum(x, y) / sxx)
}

/// `y = a + b * x1 + c * x2` by least squares; returns `(b, c)`. `None`
/// when the two regressors move together so closely (or not at all) that
/// their effects cannot be told apart.
pub fn slopes_of_two(x1: &[f64], x2: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    if x1.len() != y.len() || x2.len() != y.len() || y.len() < 3 {
        return None;
    }
    let (s11, s22, s12) = (co_sum(x1, x1), co_sum(x2, x2), co_sum(x1, x2));
    let (s1y, s2y) = (co_sum(x1, y), co_sum(x2, y));
    let det = s11 * s22 - s12 * s12;
    // Collinear within 1%: the correlation of x1 and x2 is above 0.995.
    if s11 <= 0.0 || s22 <= 0.0 || det <= 0.01 * s11 * s22 {
        return None;
    }
    Some(((s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_of_points_on_a_line_is_its_gradient() {
        let x = [0.0, 1e6, 2e6, 3e6];
        let y: Vec<f64> = x.iter().map(|m| 50e6 + 40.0 * m).collect();
        let b = slope(&x, &y).expect("slope");
        assert!((b - 40.0).abs() < 1e-9, "{b}");
    }

    #[test]
    fn slope_averages_out_noise_around_the_line() {
        let x: Vec<f64> = (0..20).map(|i| f64::from(i) * 1e5).collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, m)| 1e7 + 8.0 * m + if i % 2 == 0 { 3e4 } else { -3e4 })
            .collect();
        let b = slope(&x, &y).expect("slope");
        assert!((b - 8.0).abs() < 0.1, "{b}");
    }

    #[test]
    fn no_slope_without_two_distinct_x() {
        assert_eq!(slope(&[1.0], &[2.0]), None);
        assert_eq!(slope(&[5.0, 5.0, 5.0], &[1.0, 2.0, 3.0]), None);
        assert_eq!(slope(&[1.0, 2.0], &[1.0]), None);
    }

    #[test]
    fn two_regressors_are_told_apart_when_they_do_not_move_together() {
        // Messages grow steadily; live events rise and fall as compaction
        // runs. Memory: 30 B per message and 100 B per live event.
        let messages: Vec<f64> = (0..12).map(|i| f64::from(i) * 1e5).collect();
        let live: Vec<f64> = (0..12)
            .map(|i| 2e4 + f64::from((i * 7) % 5) * 1e4)
            .collect();
        let rss: Vec<f64> = messages
            .iter()
            .zip(&live)
            .map(|(m, e)| 4e7 + 30.0 * m + 100.0 * e)
            .collect();
        let (b, c) = slopes_of_two(&messages, &live, &rss).expect("fit");
        assert!((b - 30.0).abs() < 1e-6, "{b}");
        assert!((c - 100.0).abs() < 1e-6, "{c}");
    }

    #[test]
    fn collinear_regressors_give_no_split() {
        let messages: Vec<f64> = (0..10).map(f64::from).collect();
        let live: Vec<f64> = messages.iter().map(|m| 2.0 * m).collect();
        let rss: Vec<f64> = messages.iter().map(|m| 5.0 * m).collect();
        assert_eq!(slopes_of_two(&messages, &live, &rss), None);
        let flat = vec![7.0; 10];
        assert_eq!(slopes_of_two(&messages, &flat, &rss), None);
    }
}
