/** A device's sharing and unregistering, shown on its page (to be built). */
export function DeviceAdmin({ id }: { id: string }) {
  return <section aria-label="Sharing" data-device={id} />;
}
