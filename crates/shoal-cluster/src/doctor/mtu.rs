//! The path MTU to a peer's address, as the kernel knows it: a UDP socket connected to the address
//! (nothing is sent) reports, through `getsockopt(IP_MTU)` (`IPV6_MTU` for IPv6), the MTU of the route
//! to it — the outgoing interface's, or a smaller path MTU the kernel learned for that destination.
//! Linux only; elsewhere there is no figure ([`path_mtu`] says why).

use std::net::{IpAddr, SocketAddr, UdpSocket};

/// How the figure was found (shown next to it).
pub const SOURCE: &str = "kernel route to the peer's address (IP_MTU of a connected UDP socket)";

/// The MTU of the route to `addr`, in bytes.
pub fn path_mtu(addr: IpAddr) -> Result<u32, std::io::Error> {
    let local: SocketAddr = match addr {
        IpAddr::V4(_) => "0.0.0.0:0".parse().map_err(std::io::Error::other)?,
        IpAddr::V6(_) => "[::]:0".parse().map_err(std::io::Error::other)?,
    };
    let socket = UdpSocket::bind(local)?;
    // Any port: connecting a UDP socket only picks the route.
    socket.connect(SocketAddr::new(addr, 9))?;
    route_mtu(&socket, addr.is_ipv6())
}

#[cfg(target_os = "linux")]
fn route_mtu(socket: &UdpSocket, v6: bool) -> Result<u32, std::io::Error> {
    use std::os::fd::AsRawFd;
    let (level, name) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `mtu` and `len` are valid for writes of the sizes given, and the descriptor is open for
    // the call's duration (borrowed from `socket`).
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(mtu).map_err(|_| std::io::Error::other(format!("the kernel reported MTU {mtu}")))
}

#[cfg(not(target_os = "linux"))]
fn route_mtu(_: &UdpSocket, _: bool) -> Result<u32, std::io::Error> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the path MTU is read on Linux only",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_the_loopback_interfaces_mtu_as_ipv4_carries_it() {
        let want: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .expect("lo's mtu")
            .trim()
            .parse()
            .expect("a number");
        // lo's 65536 reads as 65535, the largest IPv4 packet.
        assert_eq!(
            path_mtu("127.0.0.1".parse().unwrap()).expect("mtu"),
            want.min(65535)
        );
    }
}
